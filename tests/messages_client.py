#!/usr/bin/env python3
"""Drives a running tensorfold server's Messages API through the official `anthropic` package; exits non-zero on
any failure and prints `ok   CASE` for each case that passed.

Run by tests/agent_apis.rs:
    python tests/messages_client.py --base-url http://127.0.0.1:PORT --api-key KEY
"""

import argparse
import sys

import anthropic

# The package no longer takes sampling fields; the server still reads them from the body.
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def create(client, model):
    message = client.messages.create(model=model, max_tokens=24, extra_body=GREEDY, system="Answer in one sentence.",
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])
    check(message.type == "message" and message.role == "assistant", f"message {message}")
    check(message.content[0].type == "text" and "Paris" in message.content[0].text, f"content {message.content}")
    check(message.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {message.stop_reason}")
    check(message.usage.output_tokens > 0 and message.usage.input_tokens > 0, f"usage {message.usage}")
    return message.content[0].text


def stream(client, model):
    """The streamed text equals the final message's, and it ends with a stop reason."""
    with client.messages.stream(model=model, max_tokens=24, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "What is the capital of France?"}]) as events:
        text = "".join(events.text_stream)
        final = events.get_final_message()
    check(text and text == final.content[0].text, f"streamed {text!r} vs {final.content}")
    check(final.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {final.stop_reason}")
    return text


def tools(client, model):
    """A forced tool use, whole and streamed; its result goes back and the model answers."""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = {"type": "tool", "name": "get_weather"}
    message = client.messages.create(model=model, max_tokens=80, extra_body=GREEDY, tools=[WEATHER], tool_choice=forced,
                                     messages=question)
    uses = [block for block in message.content if block.type == "tool_use"]
    check(message.stop_reason == "tool_use" and len(uses) == 1, f"reply {message}")
    check(uses[0].input.get("city") in ("Paris", "Lima"), f"input {uses[0].input}")
    with client.messages.stream(model=model, max_tokens=80, extra_body=GREEDY, tools=[WEATHER],
                                tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                messages=question) as events:
        final = events.get_final_message()
    streamed = [block for block in final.content if block.type == "tool_use"]
    check(len(streamed) == 1 and streamed[0].input.get("city"), f"streamed {final.content}")
    history = question + [
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 C, sunny"}]},
    ]
    answer = client.messages.create(model=model, max_tokens=16, extra_body=GREEDY, tools=[WEATHER], messages=history)
    check(answer.content and answer.content[0].type == "text", f"answer {answer.content}")
    return uses[0].input


def errors(client, model):
    """A bad request is Anthropic's error type, naming the field."""
    try:
        client.messages.create(model=model, max_tokens=8, messages=[{"role": "robot", "content": "hi"}])
        raise AssertionError("a bad role was accepted")
    except anthropic.BadRequestError as e:
        check(e.body["error"]["type"] == "invalid_request_error", f"body {e.body}")
        check("messages[0].role" in e.body["error"]["message"], f"message {e.body}")
    return "400"


def stop_sequences(client, model):
    """A stop sequence ends the text, and the reply names it."""
    message = client.messages.create(model=model, max_tokens=32, extra_body=GREEDY, stop_sequences=["Paris", "Lyon"],
                                     messages=[{"role": "user", "content": "What is the capital of France?"}])
    check(message.stop_reason == "stop_sequence" and message.stop_sequence == "Paris", f"reply {message}")
    check("Paris" not in message.content[0].text, f"text {message.content}")
    return message.content[0].text


CASES = [("create", create), ("stop_sequences", stop_sequences), ("stream", stream), ("tools", tools), ("errors", errors)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args()
    client = anthropic.Anthropic(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    failures = 0
    for name, case in CASES:
        try:
            print(f"ok   {name}: {str(case(client, 'any'))[:80]!r}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next case runs
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
