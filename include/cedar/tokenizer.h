// cedar's public API for front ends (tools/): the tokenizer (tokenizer::Tokenizer, loaded from a
// tokenizer.json folder, and the files it reads).
#pragma once

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"
