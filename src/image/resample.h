// Pillow's Image.resize with its default filter (BICUBIC, a = -0.5) on an RGB image, reproduced to the
// pixel: the separable convolution of libImaging/Resample.c with its coefficient rounding (doubles
// normalised per output pixel, then fixed point with 22 fraction bits) in two passes through an 8-bit
// intermediate: horizontal first (over only the rows the vertical pass reads), unless the height
// shrinks by more than twice as many pixels as the width, where Pillow 13 runs the vertical pass first.
#pragma once

#include "image/image_types.h"

namespace cedar::image {

// `width` x `height` >= 1. Same size: a copy, as Pillow returns.
RgbImage resize_bicubic(const RgbImage& source, int width, int height);

}  // namespace cedar::image
