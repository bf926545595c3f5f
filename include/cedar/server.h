// cedar's public API for front ends (tools/): serving. open_serving_engine (the real model or the
// scripted test engine, from EngineSetup), the OpenAI/Anthropic HTTP server (serve::ApiServer with
// its ServerOptions; api_key_problem checks a key before it is used), and the in-process
// ChatService that `cedar chat` talks to without HTTP.
#pragma once

#include "serve/api/api_server.h"
#include "serve/api/chat_service.h"
#include "serve/api/engine_setup.h"
#include "serve/http/auth.h"
