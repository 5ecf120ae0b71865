#!/usr/bin/env python3
"""Runs an OpenAI Agents SDK agent with a function tool against a running tensorfold server, through the SDK's
default model (the Responses API); exits non-zero unless the tool ran and the agent answered.

Run by tests/agent_apis.rs:
    python tests/agents_sdk.py --base-url http://127.0.0.1:PORT/v1
"""

import argparse
import asyncio
import sys

from agents import (Agent, ModelSettings, Runner, function_tool, set_default_openai_api, set_default_openai_client,
                    set_tracing_disabled)
from openai import AsyncOpenAI

CALLS = []


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"It is 21 C and sunny in {city}."


async def run(base_url):
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0), use_for_tracing=False)
    set_default_openai_api("responses")
    agent = Agent(
        name="weather",
        instructions="You answer questions about the weather with the get_weather tool.",
        model="any",
        tools=[get_weather],
        # The first turn must call the tool; the SDK resets the choice after it so the agent can answer.
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64, parallel_tool_calls=False),
    )
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    if not CALLS:
        raise AssertionError(f"the tool never ran; items: {result.new_items}")
    kinds = [item.type for item in result.new_items]
    if "tool_call_item" not in kinds or "tool_call_output_item" not in kinds:
        raise AssertionError(f"items {kinds}")
    if not isinstance(result.final_output, str) or not result.final_output.strip():
        raise AssertionError(f"final output {result.final_output!r}")
    return CALLS[0], result.final_output


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-url", required=True)
    args = parser.parse_args()
    city, answer = asyncio.run(run(args.base_url))
    print(f"ok   agent_tool: called with {city!r}, answered {answer[:60]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
