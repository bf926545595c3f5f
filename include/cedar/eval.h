// cedar's public API for front ends (tools/): `cedar eval`, scoring documents (runtime::score_document,
// EvalOptions) and the n-gram baseline it compares against.
#pragma once

#include "runtime/eval.h"
#include "runtime/ngram_baseline.h"
