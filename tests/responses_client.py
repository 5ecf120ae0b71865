#!/usr/bin/env python3
"""Drives a running tensorfold server's Responses API through the official `openai` package; exits non-zero on
any failure and prints `ok   CASE` for each case that passed.

Run by tests/responses_client.rs:
    python tests/responses_client.py --base-url http://127.0.0.1:PORT/v1
"""

import argparse
import json
import sys
import time

import openai
import pydantic

FRANCE = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
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
    """A plain response: one message item, its text as output_text, usage that adds up."""
    response = client.responses.create(model=model, input=FRANCE, instructions="Answer in one sentence.",
                                       max_output_tokens=24, temperature=0)
    check(response.object == "response" and response.id.startswith("resp_"), f"response {response.id}")
    check(response.status in ("completed", "incomplete"), f"status {response.status}")
    check(response.output[0].type == "message", f"output {response.output}")
    check("Paris" in response.output_text, f"no Paris in {response.output_text!r}")
    usage = response.usage
    check(usage.total_tokens == usage.input_tokens + usage.output_tokens, f"usage {usage}")
    return response


def stream(client, model):
    """The streamed events rebuild the same text the final response holds, numbered in order."""
    deltas, numbers, kinds = [], [], []
    with client.responses.stream(model=model, input=FRANCE, max_output_tokens=24, temperature=0) as events:
        for event in events:
            kinds.append(event.type)
            numbers.append(event.sequence_number)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = events.get_final_response()
    check(kinds[:2] == ["response.created", "response.in_progress"], f"first events {kinds[:2]}")
    check(kinds[-1] in ("response.completed", "response.incomplete"), f"last event {kinds[-1]}")
    check(numbers == list(range(len(numbers))), "sequence numbers are not 0, 1, 2, ...")
    check("".join(deltas) == final.output_text, f"deltas {''.join(deltas)!r} vs {final.output_text!r}")
    return final.output_text


class City(pydantic.BaseModel):
    name: str
    country: str


def parse(client, model):
    """`.parse` with a pydantic model: the grammar makes the text valid under its schema."""
    response = client.responses.parse(model=model, input="Name a city in France.", text_format=City,
                                      max_output_tokens=60, temperature=0)
    check(isinstance(response.output_parsed, City), f"parsed {response.output_parsed!r}")
    return response.output_parsed


def stored(client, model, first):
    """Retrieve, input items, continuation by previous_response_id, and delete."""
    again = client.responses.retrieve(first.id)
    check(again.output_text == first.output_text, "the stored response differs")
    items = client.responses.input_items.list(first.id)
    check(len(items.data) == 1 and items.data[0].type == "message", f"input items {items.data}")
    check(items.data[0].content[0].text == FRANCE, f"input item {items.data[0]}")
    follow = client.responses.create(model=model, input="And of Peru?", previous_response_id=first.id,
                                     max_output_tokens=16, temperature=0)
    check(follow.previous_response_id == first.id, "previous_response_id not echoed")
    check(follow.usage.input_tokens_details.cached_tokens > 0, "the continuation did not resume from the cache")
    deleted = client.responses.delete(follow.id)
    check(deleted is None or getattr(deleted, "deleted", True), f"delete {deleted}")
    try:
        client.responses.retrieve(follow.id)
        raise AssertionError("a deleted response was found")
    except openai.NotFoundError:
        pass
    return follow.output_text


def function_calls(client, model):
    """A forced call comes back as a function_call item; its output goes back and the model answers."""
    first = client.responses.create(model=model, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"},
                                    max_output_tokens=80, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    check(len(calls) == 1 and calls[0].name == "get_weather", f"output {first.output}")
    check(json.loads(calls[0].arguments)["city"] in ("Paris", "Lima"), f"arguments {calls[0].arguments}")
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"temp_c": 21})}
    answer = client.responses.create(model=model, input=[result], previous_response_id=first.id, tools=[WEATHER],
                                     max_output_tokens=16, temperature=0)
    check(answer.output and answer.output[0].type == "message", f"answer {answer.output}")
    streamed = []
    with client.responses.stream(model=model, input="Weather in Lima?", tools=[WEATHER], tool_choice="required",
                                 parallel_tool_calls=False, max_output_tokens=80, temperature=0) as events:
        for event in events:
            if event.type == "response.function_call_arguments.done":
                streamed.append(event.arguments)
    check(len(streamed) == 1 and "city" in json.loads(streamed[0]), f"streamed calls {streamed}")
    return calls[0].arguments


def background(client, model):
    """A background response is polled to its end; another is cancelled while it runs."""
    queued = client.responses.create(model=model, input=FRANCE, background=True, max_output_tokens=16,
                                     temperature=0)
    check(queued.status in ("queued", "in_progress"), f"status {queued.status}")
    response = queued
    deadline = time.monotonic() + 60
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.1)
        response = client.responses.retrieve(queued.id)
    check(response.status in ("completed", "incomplete") and response.output_text, f"polled {response.status}")
    long = client.responses.create(model=model, input="Tell a very long story.", background=True,
                                   max_output_tokens=4000)
    cancelled = client.responses.cancel(long.id)
    check(cancelled.status == "cancelled", f"cancel gave {cancelled.status}")
    check(client.responses.retrieve(long.id).status == "cancelled", "the cancel was not stored")
    return response.status


def websocket(client, model):
    """Three turns on one WebSocket, each continuing the last without the store; the third equals its whole
    history sent fresh over HTTP with the cache off."""
    turns, history, previous = [], [], None
    with client.responses.connect() as connection:
        for question in ["My name is Ada and I keep bees.", "What do I keep?", "And what is my name?"]:
            event = {"type": "response.create", "model": model, "input": question, "max_output_tokens": 12,
                     "temperature": 0, "store": False}
            if previous:
                event["previous_response_id"] = previous
            connection.send(event)
            deltas = []
            for server_event in connection:
                if server_event.type == "response.output_text.delta":
                    deltas.append(server_event.delta)
                if server_event.type == "error":
                    raise AssertionError(f"error event {server_event}")
                if server_event.type in ("response.completed", "response.incomplete", "response.failed"):
                    response = server_event.response
                    break
            check(response.status in ("completed", "incomplete"), f"turn {len(turns)}: {response.status}")
            check("".join(deltas) == response.output_text, "the deltas differ from the final text")
            history += [{"role": "user", "content": question}] + [item.model_dump() for item in response.output]
            turns.append(response)
            previous = response.id
    for before, turn in zip(turns, turns[1:]):
        # The last turn's reply is in the cache too, not only its prompt.
        cached = turn.usage.input_tokens_details.cached_tokens
        check(cached > before.usage.input_tokens, f"turn {turn.id} resumed {cached} tokens, only the last prompt's")
    fresh = client.responses.create(model=model, input=history[:-len(turns[-1].output)], max_output_tokens=12,
                                    temperature=0, store=False, extra_body={"cache": False})
    check(fresh.output_text == turns[-1].output_text, f"{fresh.output_text!r} vs {turns[-1].output_text!r}")
    return [turn.output_text for turn in turns]


CASES = [("create", create), ("stream", stream), ("parse", parse), ("function_calls", function_calls),
         ("background", background), ("websocket", websocket)]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    failures, first = 0, None
    for name, case in CASES:
        try:
            result = case(client, model)
            first = result if name == "create" else first
            print(f"ok   {name}: {str(result)[:80]!r}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next case runs
            failures += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    if first is not None:
        try:
            print(f"ok   stored: {stored(client, model, first)!r}")
        except Exception as e:  # noqa: BLE001
            failures += 1
            print(f"FAIL stored: {type(e).__name__}: {e}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
