"""The official OpenAI Python SDK against cedar serve: Chat Completions, Responses, Completions."""
import json

import openai
import pytest

from conftest import API_KEY

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]


@pytest.fixture()
def client(server_url):
    return openai.OpenAI(base_url=server_url + "/v1", api_key=API_KEY, max_retries=0)


def test_models(client):
    assert [m.id for m in client.models.list()] == ["cedar-test"]


def test_chat_non_streaming(client):
    r = client.chat.completions.create(model="cedar-test", messages=[{"role": "user", "content": "hi"}])
    assert r.object == "chat.completion"
    assert r.choices[0].message.content == "Hello from cedar!"
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_streaming_with_usage(client):
    stream = client.chat.completions.create(model="cedar-test", messages=[{"role": "user", "content": "hello"}],
                                            stream=True, stream_options={"include_usage": True})
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == "Hello from cedar!"
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == usage.total_tokens - usage.prompt_tokens


def test_two_turn_tool_call(client):
    messages = [{"role": "system", "content": "You answer weather questions."},
                {"role": "user", "content": "What is the weather in Paris?"}]
    r1 = client.chat.completions.create(model="cedar-test", messages=messages, tools=TOOLS)
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert "DSML" not in (choice.message.content or "")
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "rainy-7"})
    r2 = client.chat.completions.create(model="cedar-test", messages=messages, tools=TOOLS)
    assert r2.choices[0].message.content == "It is rainy in Paris."
    # The second turn re-renders the first byte for byte: all of it comes from the prefix cache.
    turn1 = r1.usage.prompt_tokens + r1.usage.completion_tokens
    assert r2.usage.prompt_tokens_details.cached_tokens == turn1


def test_streaming_tool_call_with_the_stream_helper(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    with client.chat.completions.stream(model="cedar-test", messages=messages, tools=TOOLS) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert final.choices[0].message.content == "Let me check."


def test_reasoning_content(client):
    r = client.chat.completions.create(model="cedar-test", reasoning_effort="high",
                                       messages=[{"role": "user", "content": "Why is the sky blue?"}])
    message = r.choices[0].message
    assert message.content == "Because of Rayleigh scattering."
    assert message.model_extra["reasoning_content"] == "Rayleigh scattering."
    assert r.usage.completion_tokens_details.reasoning_tokens > 0


def test_numeric_effort_extension(client):
    r = client.chat.completions.create(model="cedar-test", messages=[{"role": "user", "content": "Why is the sky blue?"}],
                                       extra_body={"reasoning_effort": 37})
    assert r.choices[0].message.content == "Because of Rayleigh scattering."


def test_responses_tool_round_trip(client):
    tools = [{"type": "function", "name": "get_weather", "description": "Weather of a city",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    first = [{"role": "user", "content": "Please think about the weather in Oslo."}]
    r1 = client.responses.create(model="cedar-test", input=first, tools=tools, reasoning={"effort": "medium"},
                                 store=False, include=["reasoning.encrypted_content"])
    kinds = [item.type for item in r1.output]
    assert kinds == ["reasoning", "function_call"]
    call = r1.output[1]
    assert json.loads(call.arguments) == {"city": "Oslo", "days": 1}
    second = first + [item.model_dump(exclude_none=True) for item in r1.output]
    second.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny-42"})
    with client.responses.stream(model="cedar-test", input=second, tools=tools, reasoning={"effort": "medium"},
                                 store=False) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Sunny, 42 degrees."
    assert final.output_text == "Sunny, 42 degrees."
    turn1 = r1.usage.input_tokens + r1.usage.output_tokens
    assert final.usage.input_tokens_details.cached_tokens == turn1


def test_legacy_completions(client):
    r = client.completions.create(model="cedar-test", prompt="Once upon", max_tokens=50)
    assert r.choices[0].text == " a time there was a fox."


def test_errors(server_url, client):
    bad_key = openai.OpenAI(base_url=server_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="cedar-test", messages=[])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="cedar-test", messages=[{"role": "user", "content": "hi"}],
                                       tool_choice="required", tools=TOOLS,
                                       extra_body={"thinking": {"type": "enabled"}})
    assert "tool_choice" in e.value.message  # a forced call needs thinking off


def test_logprobs_validate_against_the_sdk_types(client):
    """Logprobs bodies and events must validate (strictly, pydantic's model_validate) as the SDK's types."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseTextDeltaEvent, ResponseTextDoneEvent

    messages = [{"role": "user", "content": "hi"}]
    raw = client.chat.completions.with_raw_response.create(model="cedar-test", messages=messages, logprobs=True,
                                                           top_logprobs=3)
    r = ChatCompletion.model_validate(json.loads(raw.text))
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content == "Hello from cedar!"
    assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content)
    assert all(t.logprob <= 0 for t in content)

    stream = client.chat.completions.create(model="cedar-test", messages=messages, logprobs=True, top_logprobs=1,
                                            stream=True)
    tokens = []
    for chunk in stream:
        ChatCompletionChunk.model_validate(chunk.model_dump())
        for choice in chunk.choices:
            if choice.logprobs and choice.logprobs.content:
                tokens += [t.token for t in choice.logprobs.content]
    assert "".join(tokens) == "Hello from cedar!"

    raw = client.completions.with_raw_response.create(model="cedar-test", prompt="hello", logprobs=2)
    c = Completion.model_validate(json.loads(raw.text))
    lp = c.choices[0].logprobs
    assert "".join(lp.tokens) == c.choices[0].text
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)

    raw = client.responses.with_raw_response.create(model="cedar-test", input="hi", top_logprobs=2,
                                                    include=["message.output_text.logprobs"])
    resp = Response.model_validate(json.loads(raw.text))
    part = resp.output[0].content[0]
    assert "".join(t.token for t in part.logprobs) == part.text
    events = client.responses.create(model="cedar-test", input="hi", top_logprobs=2, stream=True,
                                     include=["message.output_text.logprobs"])
    deltas = []
    for event in events:
        if event.type == "response.output_text.delta":
            deltas += ResponseTextDeltaEvent.model_validate(event.model_dump()).logprobs
        if event.type == "response.output_text.done":
            ResponseTextDoneEvent.model_validate(event.model_dump())
    assert "".join(t.token for t in deltas) == "Hello from cedar!"
