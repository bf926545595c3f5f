// Server-sent events framing (the WHATWG "text/event-stream" format that the OpenAI and Anthropic
// SDKs read): `event:` names the event, each line of the payload becomes one `data:` line, a blank
// line ends the event, and a line starting with ':' is a comment the client ignores.
#pragma once

#include <string>
#include <string_view>

namespace cedar::serve {

// "data: ...\n\n" (an unnamed event, as OpenAI Chat Completions sends).
std::string sse_data(std::string_view data);
// "event: NAME\ndata: ...\n\n" (Responses and Messages streams name every event).
std::string sse_event(std::string_view name, std::string_view data);
// ": TEXT\n\n": a keep-alive that also reveals a client that went away.
std::string sse_comment(std::string_view text);

}  // namespace cedar::serve
