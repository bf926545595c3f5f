"""The official Anthropic Python SDK against cedar serve: Messages, streaming, tools, thinking."""
import anthropic
import pytest

from conftest import API_KEY

TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                           "required": ["city"]}}]


@pytest.fixture()
def client(server_url):
    return anthropic.Anthropic(base_url=server_url, api_key=API_KEY, max_retries=0)


def test_message(client):
    m = client.messages.create(model="cedar-test", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
    assert m.type == "message" and m.role == "assistant"
    assert m.content[0].type == "text" and m.content[0].text == "Hello from cedar!"
    assert m.stop_reason == "end_turn"
    assert m.usage.output_tokens > 0


def test_streaming_helper(client):
    with client.messages.stream(model="cedar-test", max_tokens=100,
                                messages=[{"role": "user", "content": "hello"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello from cedar!"
    assert final.content[0].text == "Hello from cedar!"
    assert final.stop_reason == "end_turn"


def test_two_turn_tool_use(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    m1 = client.messages.create(model="cedar-test", max_tokens=200, tools=TOOLS, messages=messages)
    assert m1.stop_reason == "tool_use"
    assert [b.type for b in m1.content] == ["text", "tool_use"]
    tool_use = m1.content[1]
    assert tool_use.name == "get_weather" and tool_use.input == {"city": "Paris", "days": 3}
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                                  "content": "rainy-7"}]})
    with client.messages.stream(model="cedar-test", max_tokens=200, tools=TOOLS, messages=messages) as stream:
        final = stream.get_final_message()
    assert final.content[0].text == "It is rainy in Paris."
    turn1 = m1.usage.input_tokens + m1.usage.cache_read_input_tokens + m1.usage.output_tokens
    assert final.usage.cache_read_input_tokens == turn1


def test_thinking_blocks(client):
    m = client.messages.create(model="cedar-test", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
                               messages=[{"role": "user", "content": "Why is the sky blue?"}])
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == "Rayleigh scattering."
    assert m.content[0].signature
    assert m.content[1].text == "Because of Rayleigh scattering."


def test_streamed_thinking_then_tool(client):
    with client.messages.stream(model="cedar-test", max_tokens=500, tools=TOOLS,
                                thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "Please think about the weather in Oslo."}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[1].input == {"city": "Oslo", "days": 1}


def test_count_tokens(client):
    r = client.messages.count_tokens(model="cedar-test", messages=[{"role": "user", "content": "hi"}])
    assert r.input_tokens > 0


def test_errors(server_url, client):
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server_url, api_key="wrong", max_retries=0).messages.create(
            model="cedar-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="cedar-test", max_tokens=10, messages=[])
    assert "messages" in str(e.value)


def test_non_json_tool_arguments_are_streamed_as_written(client):
    """A call whose DSML value is not JSON ("3 days" for a string="false" parameter), which only
    scripted output holds (a served model's tool grammar keeps arguments JSON): the message's input
    is {} and the stream carries the text as written, both as deepseek-recipe gives them. The SDK's
    stream accumulator would raise on that text, so the raw events are read."""
    messages = [{"role": "user", "content": "broken-args please"}]
    m = client.messages.create(model="cedar-test", max_tokens=200, tools=TOOLS, messages=messages)
    assert m.stop_reason == "tool_use"
    assert m.content[-1].type == "tool_use" and m.content[-1].input == {}
    events = list(client.messages.create(model="cedar-test", max_tokens=200, tools=TOOLS, messages=messages,
                                         stream=True))
    deltas = [e.delta.partial_json for e in events
              if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert deltas == ['{"city": "Paris", "days": 3 days}']


def test_calls_cut_by_max_tokens_stream_partial_json_the_helper_reads(client):
    """A call max_tokens cuts (a served model's calls are closed in time unless the budget is below
    the shortest call) streams the JSON written so far; the SDK's accumulator reads it as partial
    JSON, as it reads Anthropic's own cut calls. Every cut point of the scripted call is tried."""
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    full = client.messages.create(model="cedar-test", max_tokens=200, tools=TOOLS, messages=messages)
    cut_calls = 0
    for budget in range(1, full.usage.output_tokens):
        with client.messages.stream(model="cedar-test", max_tokens=budget, tools=TOOLS, messages=messages) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "max_tokens"
        calls = [b for b in final.content if b.type == "tool_use"]
        if calls:
            cut_calls += 1
            assert calls[0].name == "get_weather"
            # What was read is part of the complete call's input.
            assert calls[0].input.items() <= {"city": "Paris", "days": 3}.items()
    assert cut_calls > 0
