// cedar's public API for front ends (tools/): from messages and API request bodies to prompt ids.
// The DeepSeek chat encoding (chat::), the three APIs' request schemas and the prompt they render
// (serve::parse_*_request, render_chat_prompt), and image placeholders (expand_image_placeholders).
#pragma once

#include "chat/chat_encoding.h"
#include "serve/api/anthropic_schema.h"
#include "serve/api/chat_prompt.h"
#include "serve/api/image_inputs.h"
#include "serve/api/openai_schema.h"
#include "serve/api/responses_schema.h"
#include "serve/api/schema_util.h"
