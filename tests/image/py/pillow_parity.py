#!/usr/bin/env python3
"""Pillow parity of cedar's image decoder and processor (CTest image_pillow_parity).

  pillow_parity.py IMAGE_DUMP WORK_DIR

Generates a corpus of images with Pillow and numpy (sizes from 1x1 to 4000x3000, extreme aspect
ratios; RGB, grey, grey+alpha, RGBA, palette with and without transparency, 1-bit, 2/4-bit grey,
16-bit grey, 16-bit RGB/RGBA/LA PNG; JPEG incl. grey and CMYK, lossless and lossy WebP, GIF), runs
cedar's `image_dump` on it under three processor configs (the release's; a small token budget that
makes safe_resize shrink almost everything; V4-style max_wh_ratio 8), and checks against the
official processor (inference/image_processor.py) as it runs on Pillow:
  - the decoded RGB equals Pillow's `Image.open(f).convert("RGB")`: identical for lossless formats,
    within the decoder tolerance for JPEG and lossy WebP (cedar uses Debian's libjpeg-turbo/libwebp,
    Pillow's wheel bundles its own builds);
  - the plan (best size, token grid, patch grid) equals plan_image_grid's;
  - the padded canvas equals ImageOps.pad / Image.resize on the same decoded pixels, every pixel;
  - the patches equal (x/255 - 0.5)/0.5 in float32 rounded to bf16, in the reference's patch layout.
Then hostile files (truncated, corrupt, wrong magic, decompression bombs, over the byte limit) must
each be refused with a message naming the image and the problem, with bounded memory.
The expected values here come from Pillow and numpy, never from cedar.
"""
import math
import os
import resource
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
from PIL import Image, ImageOps

RELEASE = dict(patch=14, downsample=3, max_tokens=1024, min_pixels=295936, max_wh_ratio=None)
SMALL = dict(patch=14, downsample=3, max_tokens=64, min_pixels=1000, max_wh_ratio=None)
RATIO8 = dict(patch=14, downsample=3, max_tokens=384, min_pixels=147456, max_wh_ratio=8)
# Observed differences between Debian's decoders and the ones in Pillow's wheel are reported; the
# bound is the decoders' documented accuracy for the islow IDCT / libwebp's YUV->RGB (a few levels).
LOSSY_TOLERANCE = 4
HOSTILE_MEMORY_LIMIT = 256 << 20


# ---- the official processor's semantics, on Pillow ------------------------------------------------
def plan_image_grid(width, height, cfg):
    p, ds, max_n = cfg["patch"], cfg["downsample"], cfg["max_tokens"]
    ratio_limit = cfg["max_wh_ratio"]
    if ratio_limit is not None and width > height * ratio_limit:
        width = height * ratio_limit
    if 0 < width * height < cfg["min_pixels"]:
        scale = (cfg["min_pixels"] / (width * height)) ** 0.5
        width, height = int(width * scale), int(height * scale)
    best_w, best_h = math.ceil(width / p) * p, math.ceil(height / p) * p

    def grid(bh, bw):
        return math.ceil((bh // p) / ds), math.ceil((bw // p) / ds)

    n_h, n_w = grid(best_h, best_w)
    if n_h * (n_w + 1) + 2 > max_n:
        r = height / width
        max_w = math.sqrt((max_n - 2) / r + 0.25) - 0.5
        max_h = max_w * r
        cell = p * ds
        if max_w < 1.0:
            best_h, best_w = (max_n - 2) // 2 * cell, cell
        elif max_h < 1.0:
            best_h, best_w = cell, (max_n - 3) * cell
        else:
            beta = min(math.floor(max_w) * cell / width, math.floor(max_h) * cell / height)
            best_h = math.floor(height * beta / p) * p
            best_w = math.floor(width * beta / p) * p
        n_h, n_w = grid(best_h, best_w)
        assert n_h * (n_w + 1) + 2 <= max_n
    return best_w, best_h, n_h, n_w


def uncapped_size(width, height, cfg):
    """The pixel size before safe_resize: a plan that differs was shrunk to fit max_n_token."""
    big = dict(cfg, max_tokens=1 << 60)
    return plan_image_grid(width, height, big)[:2]


def reference_canvas(rgb_image, cfg):
    best_w, best_h, n_h, n_w = plan_image_grid(rgb_image.width, rgb_image.height, cfg)
    if cfg["max_wh_ratio"] is not None and rgb_image.width >= cfg["max_wh_ratio"] * rgb_image.height:
        canvas = rgb_image.resize((best_w, best_h))
    else:
        canvas = ImageOps.pad(rgb_image, (best_w, best_h), color=(127, 127, 127))
    return (best_w, best_h, n_h, n_w), np.asarray(canvas, dtype=np.uint8)


def reference_patches(canvas, p):
    x = canvas.astype(np.float32).transpose(2, 0, 1) / np.float32(255)
    x = (x - np.float32(0.5)) / np.float32(0.5)
    bits = x.view(np.uint32).astype(np.uint64)
    bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    h, w = canvas.shape[0] // p, canvas.shape[1] // p
    return bf16.reshape(3, h, p, w, p).transpose(1, 3, 0, 2, 4).reshape(-1)


# ---- the corpus ----------------------------------------------------------------------------------
def pattern(w, h, rng):
    """Gradients, hard edges and noise: a resampler error shows instead of averaging away."""
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1)).astype(np.uint8)
    g = (y * 255 // max(h - 1, 1)).astype(np.uint8)
    b = (((x // 3) + (y // 5)) % 2 * 255).astype(np.uint8)
    rgb = np.stack([r, g, b], axis=-1)
    noisy = rng.random((h, w)) < 0.15
    rgb[noisy] = rng.integers(0, 256, size=(int(noisy.sum()), 3), dtype=np.uint8)
    return rgb


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def raw_png(width, height, color_type, bit_depth, rows, extra=b""):
    """A PNG from packed rows (bytes per row), for layouts Pillow does not write (16-bit colour)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    body = b"".join(b"\x00" + row for row in rows)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra +
            png_chunk(b"IDAT", zlib.compress(body, 6)) + png_chunk(b"IEND", b""))


def encode(pil_image, fmt, **kwargs):
    # A real file, not a BytesIO: Pillow's progressive JPEG encoder fails on a BytesIO past its buffer.
    with tempfile.TemporaryFile() as f:
        pil_image.save(f, format=fmt, **kwargs)
        f.seek(0)
        return f.read()


def make_png_variant(kind, rgb, rng):
    h, w = rgb.shape[:2]
    img = Image.fromarray(rgb, "RGB")
    if kind == "rgb":
        return encode(img, "PNG", compress_level=1)
    if kind == "grey":
        return encode(img.convert("L"), "PNG", compress_level=1)
    if kind == "grey_alpha":
        la = img.convert("LA")
        la.putalpha(Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L"))
        return encode(la, "PNG", compress_level=1)
    if kind == "rgba":
        rgba = img.convert("RGBA")
        rgba.putalpha(Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8), "L"))
        return encode(rgba, "PNG", compress_level=1)
    if kind == "palette":
        return encode(img.quantize(colors=int(rng.integers(2, 257))), "PNG")
    if kind == "palette_trns":
        pal = img.quantize(colors=16)
        return encode(pal, "PNG", transparency=3)
    if kind == "bilevel":
        return encode(img.convert("1"), "PNG")
    if kind in ("grey2", "grey4"):
        depth = 2 if kind == "grey2" else 4
        levels = rng.integers(0, 1 << depth, (h, w), dtype=np.uint8)
        per_byte = 8 // depth
        padded = np.zeros((h, -(-w // per_byte) * per_byte), np.uint8)
        padded[:, :w] = levels
        packed = np.zeros((h, padded.shape[1] // per_byte), np.uint8)
        for i in range(per_byte):
            packed |= padded[:, i::per_byte] << (8 - depth * (i + 1))
        return raw_png(w, h, 0, depth, [r.tobytes() for r in packed])
    if kind == "grey16":  # values across 0..65535: Pillow clips above 255 on convert("RGB")
        v = rng.integers(0, 1 << 16, (h, w), dtype=np.uint16)
        v[:, ::3] = rng.integers(0, 256, (h, (w + 2) // 3), dtype=np.uint16)
        return raw_png(w, h, 0, 16, [r.astype(">u2").tobytes() for r in v])
    if kind in ("rgb16", "rgba16", "la16"):
        channels, color_type = {"rgb16": (3, 2), "rgba16": (4, 6), "la16": (2, 4)}[kind]
        v = rng.integers(0, 1 << 16, (h, w * channels), dtype=np.uint16)
        return raw_png(w, h, color_type, 16, [r.astype(">u2").tobytes() for r in v])
    if kind == "rgb_trns":  # a tRNS colour key on RGB: ignored by convert("RGB")
        rows = [r.tobytes() for r in rgb.reshape(h, w * 3)]
        return raw_png(w, h, 2, 8, rows, png_chunk(b"tRNS", struct.pack(">HHH", 0, 0, 255)))
    raise ValueError(kind)


PNG_KINDS = ["rgb", "grey", "grey_alpha", "rgba", "palette", "palette_trns", "bilevel", "grey2", "grey4", "grey16",
             "rgb16", "rgba16", "la16", "rgb_trns"]


def make_other_variant(kind, rgb, rng):
    img = Image.fromarray(rgb, "RGB")
    if kind == "jpeg":
        return encode(img, "JPEG", quality=90)
    if kind == "jpeg_grey":
        return encode(img.convert("L"), "JPEG", quality=85)
    if kind == "jpeg_cmyk":
        return encode(img.convert("CMYK"), "JPEG", quality=90)
    if kind == "jpeg_progressive":
        try:
            return encode(img, "JPEG", progressive=True)
        except OSError:  # Pillow 13's progressive encoder fails on some noisy images ("broken data stream")
            return encode(img, "JPEG", quality=80)
    if kind == "webp_lossless":
        rgba = img.convert("RGBA")
        rgba.putalpha(Image.fromarray(rng.integers(0, 256, rgb.shape[:2], dtype=np.uint8), "L"))
        return encode(rgba, "WEBP", lossless=True, exact=True)
    if kind == "webp_lossy":
        return encode(img, "WEBP", quality=80)
    if kind == "gif":
        return encode(img.quantize(colors=64), "GIF")
    if kind == "gif_animated":
        frames = [img.quantize(colors=32), Image.fromarray(255 - rgb, "RGB").quantize(colors=32)]
        return encode(frames[0], "GIF", save_all=True, append_images=frames[1:], transparency=1, duration=50)
    raise ValueError(kind)


OTHER_KINDS = ["jpeg", "jpeg_grey", "jpeg_cmyk", "jpeg_progressive", "webp_lossless", "webp_lossy", "gif",
               "gif_animated"]
LOSSY = {"jpeg", "jpeg_grey", "jpeg_cmyk", "jpeg_progressive", "webp_lossy"}
EXT = {"jpeg": "jpg", "webp": "webp", "gif": "gif"}


def corpus(rng):
    sizes = [(1, 1), (1, 2), (2, 1), (3, 3), (13, 14), (14, 14), (15, 15), (27, 41), (41, 27), (64, 64), (100, 37),
             (299, 300), (543, 545), (544, 544), (545, 544), (600, 400), (400, 600), (1000, 1000), (1023, 767),
             (1280, 720), (720, 1280), (1920, 1080), (2000, 1), (1, 2000), (3000, 2), (2, 3000), (5000, 4),
             (4, 5000), (8000, 16), (16, 8000), (673, 29), (29, 673)]
    for _ in range(40):
        sizes.append(tuple(int(v) for v in np.exp(rng.uniform(0, math.log(2500), 2)).round().clip(1, None)))
    cases = []
    for i, (w, h) in enumerate(sizes):
        rgb = pattern(w, h, rng)
        for j in range(2):
            kind = PNG_KINDS[(2 * i + j) % len(PNG_KINDS)]
            cases.append((f"{i:03d}_{w}x{h}_{kind}.png", make_png_variant(kind, rgb, rng), kind))
        kind = OTHER_KINDS[i % len(OTHER_KINDS)]
        ext = EXT[kind.split("_")[0]]
        cases.append((f"{i:03d}_{w}x{h}_{kind}.{ext}", make_other_variant(kind, rgb, rng), kind))
    # The largest size the issue names, once per family: a lossless PNG and a JPEG.
    big = pattern(4000, 3000, rng)
    cases.append(("big_4000x3000_rgb.png", make_png_variant("rgb", big, rng), "rgb"))
    cases.append(("big_4000x3000_jpeg.jpg", make_other_variant("jpeg", big, rng), "jpeg"))
    return cases


# ---- running cedar and comparing -----------------------------------------------------------------
def run_dump(image_dump, out_dir, files, cfg, memory_limit=None):
    os.makedirs(out_dir, exist_ok=True)
    flags = ["--patch", str(cfg["patch"]), "--downsample", str(cfg["downsample"]), "--max-tokens",
             str(cfg["max_tokens"]), "--min-pixels", str(cfg["min_pixels"])]
    if cfg["max_wh_ratio"] is not None:
        flags += ["--max-wh-ratio", str(cfg["max_wh_ratio"])]
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))

    subprocess.run([image_dump, *flags, out_dir, *files], check=True,
                   preexec_fn=limit_memory if memory_limit else None)


def read_dump(path, p):
    data = open(path, "rb").read()
    dw, dh, bw, bh, n_h, n_w, nv_h, nv_w = struct.unpack("<8i", data[:32])
    at = 32
    decoded = np.frombuffer(data, np.uint8, dw * dh * 3, at).reshape(dh, dw, 3)
    at += dw * dh * 3
    canvas = np.frombuffer(data, np.uint8, bw * bh * 3, at).reshape(bh, bw, 3)
    at += bw * bh * 3
    patches = np.frombuffer(data, np.uint16, nv_h * nv_w * 3 * p * p, at)
    return (bw, bh, n_h, n_w), (nv_h, nv_w), decoded, canvas, patches


def check_config(image_dump, work, files, kinds, cfg, label, stats):
    out_dir = os.path.join(work, "out_" + label)
    run_dump(image_dump, out_dir, files, cfg)
    failures = []
    p = cfg["patch"]
    for path in files:
        name = os.path.basename(path)
        kind = kinds[name]
        err = os.path.join(out_dir, name + ".err")
        if os.path.exists(err):
            failures.append(f"{label} {name}: cedar refused it: {open(err).read()}")
            continue
        plan, vit, decoded, canvas, patches = read_dump(os.path.join(out_dir, name + ".bin"), p)
        with Image.open(path) as source:
            expected = np.asarray(source.convert("RGB"), dtype=np.uint8)
        if decoded.shape != expected.shape:
            failures.append(f"{label} {name}: decoded {decoded.shape}, Pillow {expected.shape}")
            continue
        diff = int(np.abs(decoded.astype(int) - expected.astype(int)).max()) if decoded.size else 0
        if kind in LOSSY:
            stats["lossy_max"] = max(stats["lossy_max"], diff)
            stats["lossy_exact"] += diff == 0
            stats["lossy"] += 1
            if diff > LOSSY_TOLERANCE:
                failures.append(f"{label} {name}: decoded pixels differ by {diff} > {LOSSY_TOLERANCE}")
        elif diff:
            failures.append(f"{label} {name}: decoded pixels differ from Pillow's by up to {diff}")
        # The processor on the very pixels cedar decoded: exact for every format.
        ref_plan, ref_canvas = reference_canvas(Image.fromarray(np.ascontiguousarray(decoded), "RGB"), cfg)
        if plan != ref_plan:
            failures.append(f"{label} {name}: plan {plan}, reference {ref_plan}")
            continue
        if vit != (plan[1] // p, plan[0] // p):
            failures.append(f"{label} {name}: patch grid {vit} for best size {plan[:2]}")
        if not np.array_equal(canvas, ref_canvas):
            bad = int((canvas != ref_canvas).any(axis=-1).sum())
            failures.append(f"{label} {name}: {bad} canvas pixels differ from ImageOps.pad/resize")
            continue
        if not np.array_equal(patches, reference_patches(ref_canvas, p)):
            failures.append(f"{label} {name}: patches differ from (x/255-0.5)/0.5 in bf16")
        stats["checked"] += 1
        stats["upscaled"] += 0 < decoded.shape[0] * decoded.shape[1] < cfg["min_pixels"]
        stats["capped"] += plan[:2] != uncapped_size(decoded.shape[1], decoded.shape[0], cfg)
    return failures


def hostile_cases(rng):
    good_png = encode(Image.fromarray(pattern(64, 48, rng), "RGB"), "PNG")
    good_jpeg = encode(Image.fromarray(pattern(64, 48, rng), "RGB"), "JPEG")
    good_gif = encode(Image.fromarray(pattern(64, 48, rng), "RGB").quantize(colors=16), "GIF")
    good_webp = encode(Image.fromarray(pattern(64, 48, rng), "RGB"), "WEBP", quality=70)
    # A PNG bomb: a 60000x60000 grey canvas (3.6 G pixels) declared in a few hundred bytes.
    bomb_rows = zlib.compress(b"\x00" * 60001 * 4, 9)
    png_bomb = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 0, 0, 0, 0)) +
                png_chunk(b"IDAT", bomb_rows) + png_chunk(b"IEND", b""))
    # 8000x8000 (64 MP, over the 50 MP default) PNG that really decodes: a bomb by compression ratio.
    png_64mp = raw_png(8000, 8000, 0, 1, [b"\x00" * 1000] * 8000)
    jpeg_bomb = bytearray(good_jpeg)
    sof = jpeg_bomb.find(b"\xff\xc0")
    jpeg_bomb[sof + 5:sof + 9] = struct.pack(">HH", 65000, 65000)
    gif_bomb = bytearray(good_gif)
    gif_bomb[6:10] = struct.pack("<HH", 65535, 65535)
    corrupt_png = bytearray(good_png)
    corrupt_png[40:60] = bytes(20)  # inside IDAT: zlib/CRC error
    return [
        ("truncated.png", good_png[: len(good_png) // 2], "truncated or corrupt"),
        ("truncated.jpg", good_jpeg[: len(good_jpeg) // 2], "truncated or corrupt"),
        ("truncated.gif", good_gif[: len(good_gif) // 2], "truncated or corrupt"),
        ("truncated.webp", good_webp[: len(good_webp) // 2], "truncated or corrupt"),
        ("corrupt.png", bytes(corrupt_png), "truncated or corrupt"),
        ("header_only.png", good_png[:30], "truncated or corrupt"),
        ("wrong_magic.png", b"<html>not an image</html>", "not a PNG, JPEG, WebP or GIF"),
        ("empty.png", b"", "not a PNG, JPEG, WebP or GIF"),
        ("bomb.png", png_bomb, "pixels"),
        ("bomb64mp.png", png_64mp, "pixels"),
        ("bomb.jpg", bytes(jpeg_bomb), "pixels"),
        ("bomb.gif", bytes(gif_bomb), "pixels"),
        ("fifty_mb.png", good_png + bytes(50 << 20), "bytes exceed the limit"),
    ]


def main():
    image_dump, work = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(20261207)
    in_dir = os.path.join(work, "in")
    os.makedirs(in_dir)
    files, kinds = [], {}
    for name, data, kind in corpus(rng):
        path = os.path.join(in_dir, name)
        open(path, "wb").write(data)
        files.append(path)
        kinds[name] = kind
    stats = dict(checked=0, lossy=0, lossy_exact=0, lossy_max=0, upscaled=0, capped=0)
    failures = check_config(image_dump, work, files, kinds, RELEASE, "release", stats)
    small = [f for f in files if "big_" not in f]
    failures += check_config(image_dump, work, small, kinds, SMALL, "small", stats)
    failures += check_config(image_dump, work, small[::3], kinds, RATIO8, "ratio8", stats)

    hostile_dir = os.path.join(work, "hostile")
    os.makedirs(hostile_dir)
    hostile = hostile_cases(rng)
    paths = []
    for name, data, _ in hostile:
        paths.append(os.path.join(hostile_dir, name))
        open(paths[-1], "wb").write(data)
    out_dir = os.path.join(work, "out_hostile")
    # Bounded memory: the whole hostile batch runs in 256 MiB of address space (the 50 MB file is read
    # whole by image_dump itself); a decoder that believed a bomb's header would abort here.
    run_dump(image_dump, out_dir, paths, RELEASE, memory_limit=HOSTILE_MEMORY_LIMIT)
    for name, _, expect in hostile:
        err = os.path.join(out_dir, name + ".err")
        if not os.path.exists(err):
            failures.append(f"hostile {name}: cedar accepted it")
            continue
        message = open(err).read()
        if f"'{name}'" not in message or expect not in message:
            failures.append(f"hostile {name}: message lacks the image name or '{expect}': {message}")

    print(f"Pillow {Image.__version__}: {stats['checked']} image/config pairs identical to the official processor "
          f"({len(files)} images; {stats['upscaled']} upscaled to min_pixels, {stats['capped']} at the token cap); "
          f"lossy decodes: {stats['lossy_exact']}/{stats['lossy']} identical to Pillow's, max difference "
          f"{stats['lossy_max']}; {len(hostile)} hostile files refused within {HOSTILE_MEMORY_LIMIT >> 20} MiB")
    for f in failures:
        print("FAIL", f)
    print(f"{stats['checked'] + len(hostile) - sum(1 for f in failures if f.startswith('hostile'))} passed, "
          f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
