#!/usr/bin/env python3
"""Drives a running tensorfold server through the official `openai` package; exits non-zero on any failure.

Run by tests/openai_client.rs:
    python tests/openai_client.py --base-url http://127.0.0.1:PORT/v1 [--speech] [--default-base-url URL]
"""

import argparse
import array
import os
import struct
import sys
import tempfile

import openai

FRANCE = "What is the capital of France?"
SPEECH_TEXT = "Hello there, how are you today?"
WAV_HEADER_BYTES = 44
SAMPLE_RATE = 24000


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def chat_non_streaming(client, model):
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": FRANCE}], max_tokens=24, temperature=0
    )
    choice = response.choices[0]
    check(choice.message.role == "assistant", f"role {choice.message.role!r}")
    check("Paris" in (choice.message.content or ""), f"no Paris in {choice.message.content!r}")
    check(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    usage = response.usage
    check(usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, f"usage {usage}")
    return choice.message.content, usage.completion_tokens


def chat_streaming(client, model):
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": FRANCE}],
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, roles, finish, usage = "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    check(roles[:1] == ["assistant"], f"roles {roles}")
    check(finish in ("stop", "length"), f"finish_reason {finish!r}")
    check(usage is not None, "no usage chunk with include_usage")
    return text, usage.completion_tokens


def completions(client, model):
    kwargs = dict(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    plain = client.completions.create(**kwargs)
    check(plain.choices[0].text, f"empty completion {plain}")
    chunks = client.completions.create(stream=True, **kwargs)
    streamed = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
    check(streamed == plain.choices[0].text, f"streamed {streamed!r} != plain {plain.choices[0].text!r}")


def chat_n(client, model):
    """n choices equal solo requests with seed, seed + 1, ..., streamed and not."""
    kwargs = dict(model=model, messages=[{"role": "user", "content": FRANCE}], max_tokens=10, temperature=0.8)
    solo = [client.chat.completions.create(seed=7 + i, **kwargs).choices[0].message.content for i in range(3)]
    response = client.chat.completions.create(n=3, seed=7, **kwargs)
    check([c.index for c in response.choices] == [0, 1, 2], f"indexes {[c.index for c in response.choices]}")
    check([c.message.content for c in response.choices] == solo, f"{response.choices} != {solo}")
    stream = client.chat.completions.create(
        n=3, seed=7, stream=True, stream_options={"include_usage": True}, **kwargs
    )
    texts, finishes, usages = ["", "", ""], [0, 0, 0], 0
    for chunk in stream:
        usages += chunk.usage is not None
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] += choice.finish_reason is not None
    check(texts == solo, f"streamed {texts} != {solo}")
    check(finishes == [1, 1, 1] and usages == 1, f"finishes {finishes}, usage chunks {usages}")


def penalties_and_bias(client, model):
    prompt = "one two one two one two one two one two one two"
    kwargs = dict(model=model, prompt=prompt, max_tokens=12, temperature=0)
    plain = client.completions.create(**kwargs).choices[0].text
    for penalty in ("presence_penalty", "frequency_penalty"):
        text = client.completions.create(**{penalty: 2.0}, **kwargs).choices[0].text
        check(text != plain, f"{penalty} left {plain!r} as it was")
    first = client.completions.create(logprobs=0, **dict(kwargs, max_tokens=4))
    tokens = first.choices[0].logprobs.tokens
    check(len(tokens) == 4, f"tokens {tokens}")
    biased = client.completions.create(logit_bias={"28": 100}, logprobs=0, **dict(kwargs, max_tokens=4))
    forced = biased.choices[0].logprobs.tokens
    check(len(set(forced)) == 1 and len(forced) == 4, f"logit_bias +100 gave {forced}")
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, logit_bias={"1": 500}
        )
    except openai.BadRequestError as error:
        check(error.body.get("param") == "logit_bias", f"error body {error.body}")
    else:
        raise AssertionError("logit_bias 500 did not raise openai.BadRequestError")


def max_completion_tokens(client, model):
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": FRANCE}], max_completion_tokens=3, max_tokens=40
    )
    check(response.usage.completion_tokens <= 3, f"usage {response.usage}")
    response = client.completions.create(
        model=model, prompt="Hello", max_tokens=40, extra_body={"max_completion_tokens": 3}
    )
    check(response.usage.completion_tokens <= 3, f"usage {response.usage}")


def streamed_logprobs(client, model):
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": FRANCE}], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=3, stream=True,
    )
    entries = [e for chunk in stream for c in chunk.choices if c.logprobs for e in c.logprobs.content or []]
    check(entries and all(len(e.top_logprobs) == 3 for e in entries), f"chat logprobs {entries}")
    stream = client.completions.create(model=model, prompt=FRANCE, max_tokens=6, logprobs=2, stream=True)
    tops = [c.logprobs.top_logprobs[0] for chunk in stream for c in chunk.choices if c.logprobs]
    check(tops and all(len(t) == 2 for t in tops), f"completion logprobs {tops}")


def echo_and_list_prompts(client, model):
    prompts = ["The capital of France is", "My favourite colour is"]
    kwargs = dict(model=model, max_tokens=6, temperature=0)
    solo = [client.completions.create(prompt=p, **kwargs).choices[0].text for p in prompts]
    listed = client.completions.create(prompt=prompts, n=2, **kwargs)
    texts = [c.text for c in sorted(listed.choices, key=lambda c: c.index)]
    check(texts == [solo[0], solo[0], solo[1], solo[1]], f"list prompts {texts} vs {solo}")
    echoed = client.completions.create(prompt=prompts[0], echo=True, **kwargs).choices[0].text
    check(echoed == prompts[0] + solo[0], f"echo {echoed!r}")
    stream = client.completions.create(prompt=prompts, echo=True, stream=True, **kwargs)
    streamed = ["", ""]
    for chunk in stream:
        for c in chunk.choices:
            streamed[c.index] += c.text
    check(streamed == [p + s for p, s in zip(prompts, solo)], f"streamed echo {streamed}")


CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "population": {"type": "integer", "minimum": 0, "maximum": 99999999},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}


def json_formats(client, model):
    import json

    messages = [{"role": "user", "content": "Give the capital of France and its population as JSON."}]
    kwargs = dict(model=model, messages=messages, max_tokens=64, temperature=0)
    response_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    value = json.loads(client.chat.completions.create(response_format=response_format, **kwargs).choices[0].message.content)
    check(set(value) == {"city", "population"} and isinstance(value["population"], int), f"json_schema {value}")
    stream = client.chat.completions.create(response_format=response_format, stream=True, **kwargs)
    text = "".join(c.delta.content or "" for chunk in stream for c in chunk.choices)
    check(json.loads(text) == value, f"streamed {text!r} != {value}")
    obj = client.chat.completions.create(response_format={"type": "json_object"}, **kwargs).choices[0].message.content
    check(isinstance(json.loads(obj), dict), f"json_object {obj!r}")
    try:
        import pydantic
    except ImportError:
        return value

    class City(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=12)
        population: int = pydantic.Field(ge=0, le=99999999)

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    parsed = parse(response_format=City, **kwargs).choices[0].message.parsed
    check(isinstance(parsed, City), f"parsed {parsed!r}")
    return value


def bad_request_surfaces(client, model):
    try:
        client.chat.completions.create(model=model, messages=[], max_tokens=4)
    except openai.BadRequestError as error:
        check(error.status_code == 400, f"status {error.status_code}")
        return
    raise AssertionError("empty messages did not raise openai.BadRequestError")


def speech_bytes(client, response_format, voice="tara"):
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice=voice, input=SPEECH_TEXT, response_format=response_format, extra_body={"seed": 7}
    ) as response:
        check(response.status_code == 200, f"status {response.status_code}")
        check(response.headers.get("x-sample-rate") == str(SAMPLE_RATE), f"headers {dict(response.headers)}")
        return b"".join(response.iter_bytes())


def speech_pcm(client, model):
    audio = speech_bytes(client, "pcm")
    check(audio and len(audio) % 2 == 0, f"{len(audio)} bytes of 16-bit PCM")
    check(any(audio), "the PCM is silent")
    return audio


def speech_wav(client, model):
    audio = speech_bytes(client, "wav")
    check(len(audio) > WAV_HEADER_BYTES, f"{len(audio)} bytes of WAV")
    riff, wave, fmt, data = audio[0:4], audio[8:12], audio[12:16], audio[36:40]
    check((riff, wave, fmt, data) == (b"RIFF", b"WAVE", b"fmt ", b"data"), f"chunk tags {riff, wave, fmt, data}")
    fields = struct.unpack("<HHIIHH", audio[20:36])
    check(fields == (1, 1, SAMPLE_RATE, SAMPLE_RATE * 2, 2, 16), f"fmt fields {fields}")
    return audio[WAV_HEADER_BYTES:]


def default_voice(client, model):
    audio = speech_bytes(client, "pcm", voice="heart")
    seconds = len(audio) / 2 / SAMPLE_RATE
    check(0.5 < seconds < 10, f"{seconds:.2f} s of audio for {SPEECH_TEXT!r}")
    check(any(audio), "the PCM is silent")
    return audio


def default_server_mp3(client):
    """OpenAI's own call with nothing else, against the default server: playable mp3 in the default voice."""
    import av  # PyAV's FFmpeg decoders share no code with the server's LAME encoder

    response = client.audio.speech.create(model="tts-1", voice="alloy", input=SPEECH_TEXT)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "speech.mp3")
        response.write_to_file(path)
        with av.open(path) as container:
            check(container.format.name == "mp3", f"container {container.format.name!r}")
            stream = container.streams.audio[0]
            check(stream.codec_context.name.startswith("mp3"), f"codec {stream.codec_context.name!r}")
            check(stream.codec_context.sample_rate == SAMPLE_RATE, f"rate {stream.codec_context.sample_rate}")
            frames = list(container.decode(stream))
            check(all(frame.format.name == "fltp" for frame in frames), "FFmpeg's mp3 decoder gives planar floats")
            samples = [x for f in frames for x in array.array("f", bytes(f.planes[0])[: 4 * f.samples])]
    seconds = len(samples) / SAMPLE_RATE
    check(0.5 < seconds < 10, f"{seconds:.2f} s of mp3 for {SPEECH_TEXT!r}")
    loudest = max(abs(x) for x in samples)
    check(loudest > 0.01, f"the mp3 is silent (peak {loudest})")
    return seconds


def default_server_opus(client):
    """The default voice as Ogg Opus, decoded by FFmpeg through PyAV: an independent decoder for the server's encoder."""
    import av

    response = client.audio.speech.create(model="tts-1", voice="alloy", input=SPEECH_TEXT, response_format="opus")
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "speech.opus")
        response.write_to_file(path)
        with av.open(path) as container:
            check(container.format.name == "ogg", f"container {container.format.name!r}")
            stream = container.streams.audio[0]
            check(stream.codec_context.name.endswith("opus"), f"codec {stream.codec_context.name!r}")
            frames = list(container.decode(stream))
            check(all(frame.format.name in ("flt", "fltp") for frame in frames), "FFmpeg's Opus decoder gives floats")
            samples = [x for f in frames for x in array.array("f", bytes(f.planes[0])[: 4 * f.samples])]
            rate = stream.codec_context.sample_rate
    seconds = len(samples) / rate
    check(0.5 < seconds < 10, f"{seconds:.2f} s of Opus at {rate} Hz for {SPEECH_TEXT!r}")
    loudest = max(abs(float(x)) for x in samples)
    check(loudest > 0.01, f"the Opus is silent (peak {loudest})")
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server's /v1 URL")
    parser.add_argument("--api-key", default="unused", help="sent as the Bearer token")
    parser.add_argument("--speech", action="store_true", help="also run the /v1/audio/speech cases")
    parser.add_argument("--default-base-url", help="a server started without flags: run OpenAI's plain speech call")
    args = parser.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, timeout=300, max_retries=0)
    models = client.models.list().data
    check(models, "no models listed")
    model = models[0].id

    failures = 0
    results = {}
    cases = [
        ("chat", chat_non_streaming),
        ("chat_stream", chat_streaming),
        ("completions", completions),
        ("bad_request", bad_request_surfaces),
        ("chat_n", chat_n),
        ("penalties_and_bias", penalties_and_bias),
        ("max_completion_tokens", max_completion_tokens),
        ("streamed_logprobs", streamed_logprobs),
        ("echo_and_list_prompts", echo_and_list_prompts),
        ("json_formats", json_formats),
        ("embeddings", embeddings),
        ("tool_calls", tool_calls),
    ]
    if args.speech:
        cases += [("speech_pcm", speech_pcm), ("speech_wav", speech_wav), ("speech_default_voice", default_voice)]
    if args.default_base_url:
        default = openai.OpenAI(base_url=args.default_base_url, api_key=args.api_key, timeout=300, max_retries=0)
        cases.append(("speech_default_mp3", lambda *_: default_server_mp3(default)))
        cases.append(("speech_default_opus", lambda *_: default_server_opus(default)))
    for name, case in cases:
        try:
            results[name] = case(client, model)
            print(f"ok   {name}")
        except Exception as error:  # every failure is reported, then the exit status says it
            failures += 1
            print(f"FAIL {name}: {type(error).__name__}: {error}")
    if "chat" in results and "chat_stream" in results and results["chat"] != results["chat_stream"]:
        failures += 1
        print(f"FAIL greedy chat streamed {results['chat_stream']!r} != plain {results['chat']!r}")
    if "speech_pcm" in results and "speech_wav" in results and results["speech_pcm"] != results["speech_wav"]:
        failures += 1
        print("FAIL the WAV samples differ from the PCM of the same seed")
    sys.exit(1 if failures else 0)


def embeddings(client, model):
    """/v1/embeddings: floats, base64 asked for (the string, which the client leaves alone) and the client's default
    (it asks for base64 and decodes it itself) give the same unit vectors."""
    import base64

    texts = ["The cat sat on the mat.", "Quarterly revenue rose by eight percent."]
    floats = client.embeddings.create(model=model, input=texts, encoding_format="float")
    raw = client.embeddings.create(model=model, input=texts, encoding_format="base64")
    default = client.embeddings.create(model=model, input=texts)
    check(len(floats.data) == len(texts) and floats.usage.prompt_tokens > 0, f"floats reply: {floats}")
    for f, r, d in zip(floats.data, raw.data, default.data):
        check(isinstance(r.embedding, str), f"base64 asked for, got {type(r.embedding).__name__}")
        decoded = array.array("f", base64.b64decode(r.embedding)).tolist()
        check(d.embedding == decoded, "the client's decoded default differs from the base64 asked for")
        check(max(abs(a - b) for a, b in zip(f.embedding, decoded)) < 1e-6, "floats differ from base64")
        norm = sum(v * v for v in decoded) ** 0.5
        check(abs(norm - 1) < 1e-4, f"norm {norm}")
    return len(floats.data[0].embedding)


def tool_calls(client, model):
    """Tools: a forced call comes back as tool_calls whose arguments parse and match the schema, streamed and not,
    and its result goes back as a tool message."""
    import json

    tool = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Lima"]}},
                           "required": ["city"], "additionalProperties": False}}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    reply = client.chat.completions.create(model=model, messages=messages, tools=[tool], tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=80, temperature=0)
    choice = reply.choices[0]
    check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
    call = choice.message.tool_calls[0]
    check(call.function.name == "get_weather" and call.id.startswith("call_"), f"call {call}")
    check(json.loads(call.function.arguments)["city"] in ("Paris", "Lima"), f"arguments {call.function.arguments}")
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = client.chat.completions.create(model=model, messages=messages, tools=[tool], tool_choice=named,
                                            max_tokens=80, temperature=0, stream=True)
    names, arguments = [], []
    for chunk in stream:
        for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if delta.function.name:
                names.append(delta.function.name)
                arguments.append("")
            arguments[delta.index] += delta.function.arguments or ""
    check(names == ["get_weather"], f"streamed names {names}")
    check(json.loads(arguments[0])["city"] in ("Paris", "Lima"), f"streamed arguments {arguments}")
    history = messages + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "{\"temp_c\": 21}"}]
    answer = client.chat.completions.create(model=model, messages=history, tools=[tool], max_tokens=8)
    check(answer.choices[0].message is not None, "no answer to the tool result")
    return call.function.name


if __name__ == "__main__":
    main()
