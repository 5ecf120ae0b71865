#!/usr/bin/env python3
"""Writes tests/data/tokenizer_smollm2.json: a tokenizer corpus with reference ids, decodes and chat goldens.

The reference is transformers' own GGUF tokenizer loading. Where it disagrees with the model's own
tokenizer.json pipeline (SmolLM2 splits digits one by one; transformers' GGUF loader maps the
"smollm" pre-tokenizer to plain GPT-2 byte level and does not), the case also carries
`tokenizer_json_ids`, the ids of the pipeline the model was trained with.

Usage: python tools/tokenizer_corpus.py MODEL.gguf [OUT.json]   (MODEL defaults to $TF_MODEL)
"""

import json
import os
import sys
from pathlib import Path

import tokenizers
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template


def corpus():
    """At least 200 strings covering what a byte-level BPE tokenizer gets wrong first."""
    texts = [
        "",
        " ",
        "  ",
        "\n",
        "\t",
        "Hello world",
        " Hello world",
        "  Hello world",
        "Hello world ",
        "Hello world  ",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "THE QUICK BROWN FOX",
        "tHe QuIcK bRoWn FoX",
        "hello\nworld",
        "hello\n\nworld",
        "hello\r\nworld",
        "hello\n \n world",
        "line one\n\n\n\nline five",
        "trailing newline\n",
        "\nleading newline",
        "a\tb\tc",
        "\t\tindented with tabs",
        " \t \n \t\n",
        "mixed \t\n whitespace \n\t runs",
        "word" + " " * 17 + "word",
        " " * 64,
        "\n" * 12,
        "\t" * 9 + "x",
        "x" + " \n" * 6,
        "end with spaces" + " " * 5,
    ]
    contractions = [
        "I'm sure they'll say it's fine, don't you think? We've seen it.",
        "You're right, I'd rather she'd've stayed.",
        "IT'S LOUD, DON'T SHOUT, WE'RE HERE",
        "it 's spaced ' s oddly",
        "rock 'n' roll",
        "'quoted' and \"double quoted\"",
        "O'Neill's dog's bone",
        "can't won't shan't y'all ma'am",
        "’curly’ apostrophes aren’t ASCII",
    ]
    numbers = [
        "0", "7", "42", "123", "1234", "12345", "123456", "1234567", "12345678901234567890",
        "3.14159", "-273.15", "1e-10", "6.022e23", "0x1F", "0b1010", "1,000,000", "1_000_000",
        "In 2024, 17 of 365 days were 42.5% rainy.", "Call 555-0199 or +1 (800) 123-4567.",
        "Version 1.2.3-rc.4+build.567", "Pi is about 3.14 and e about 2.718",
        "12:34:56 on 2025-01-31", "٣٤٥ Arabic-Indic digits", "१२३ Devanagari digits", "Ⅻ roman numeral",
        "½ ¾ ⅓ fractions", "a1b2c3d4", "99 bottles, 98 bottles, 97 bottles",
    ]
    unicode_texts = [
        "Café naïve résumé façade Ångström",
        "e\u0301 combining acute vs é precomposed",
        "Straße, Ärger, Öl, Übel",
        "Ελληνικά γράμματα",
        "Русский текст с пунктуацией!",
        "你好，世界！这是一个测试。",
        "日本語のテキストとカタカナ、ひらがな。",
        "한국어 텍스트입니다",
        "中文English混合text",
        "مرحبا بالعالم",
        "اللغة العربية جميلة.",
        "नमस्ते दुनिया",
        "हिन्दी में लिखा गया वाक्य।",
        "ภาษาไทย",
        "עברית מימין לשמאל",
        "Tiếng Việt có dấu",
        "ẞ ß ﬁ ﬀ ligatures",
        "zero\u200bwidth\u200cjoiner\u200dtest",
        "non\u00a0breaking\u00a0space",
        "soft\u00adhyphen",
        "\ufeffBOM at start",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝒶𝓁𝓅𝒽𝒶",
        "∀x∈ℝ: x² ≥ 0 ∧ √4 = 2",
        "←↑→↓ ⇒ ⇔ ∞",
        "™ © ® § ¶ † ‡",
        "¡Hola! ¿Qué tal?",
        "« guillemets » „Anführungszeichen“",
        "\u0000 nul and \u0007 bell",
        "\u2028line separator\u2029paragraph",
        "ﾊﾝｶｸ half-width katakana",
        "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ",
    ]
    emoji = [
        "😀",
        "😀😃😄😁",
        "I love pizza 🍕 and sushi 🍣!",
        "👍🏽 thumbs up, medium skin",
        "👨‍👩‍👧‍👦 family ZWJ sequence",
        "👩🏾‍💻 technologist",
        "🏳️‍🌈 rainbow flag",
        "🏴󠁧󠁢󠁳󠁣󠁴󠁿 Scotland tag sequence",
        "❤️ red heart with VS16",
        "🇺🇸🇯🇵🇩🇪 flags",
        "1️⃣ keycap",
        "emoji🙂inside🙃words",
        "🧑‍🤝‍🧑 people holding hands",
        "😀 " * 10,
        "🤖: beep boop",
        "🫠🫡🫶 newer emoji",
    ]
    code = [
        "def add(a, b):\n    return a + b\n",
        "class Foo:\n    def __init__(self):\n        self.x = 1\n",
        "for i in range(10):\n\tprint(i)",
        "if (x == 1) { return; } else { x++; }",
        "fn main() {\n    println!(\"Hello, {}!\", name);\n}",
        "let v: Vec<u32> = (0..10).map(|x| x * 2).collect();",
        "impl<'a> Iterator for Tokens<'a> { type Item = &'a str; }",
        "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }",
        "std::vector<std::string> names{\"a\", \"b\"};",
        "const f = async (x) => { await g(x ?? 0); };",
        "console.log(`template ${literal}`);",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "<div class=\"container\"><p>Hello &amp; welcome</p></div>",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
        "key: value\nlist:\n  - one\n  - two\n",
        "#!/bin/bash\nfor f in *.txt; do echo \"$f\"; done",
        "ls -la | grep '^d' > dirs.txt 2>&1",
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }",
        "public static void main(String[] args) { System.out.println(args.length); }",
        "x := map[string]int{\"a\": 1}",
        "(defun square (x) (* x x))",
        "main = putStrLn \"hello\" >> return ()",
        "SUM(A1:A10) / COUNT(B:B)",
        "\\begin{equation} E = mc^2 \\end{equation}",
        "a != b && c <= d || e >= f",
        "x += 1; y -= 2; z *= 3; w /= 4; v %= 5;",
        "arr[i][j] = arr[i - 1][j - 1] + 1;",
        "    indented four\n        indented eight\n",
        "// comment\n/* block\n   comment */",
        "# Markdown title\n\n- item *one*\n- item **two**\n\n```python\nprint(1)\n```",
        "https://example.com/path?query=1&other=two#frag",
        "user@example.com, first.last+tag@sub.example.org",
        "C:\\Users\\name\\Documents\\file.txt",
        "/usr/local/bin/python3 --version",
        "re.compile(r'^\\s*(\\d+)\\s*$')",
    ]
    punctuation = [
        "!!!", "???", "...", "!?!?!?", "----------", "==========", "**********", "__init__",
        "~~~~", "^^^", "$$$", "###", "@@@", "&&&", "|||", "<<<>>>", "((()))", "[[[]]]", "{{{}}}",
        ";;;", ":::", ",,,", "'''", "\"\"\"", "``` ```", "........................................",
        "Wait... what?!", "No!!! Never!!!", "Hmm?? Really??", "a-b--c---d", "a/b//c///d",
        "-->", "<!--", "=>", "->", "::", "..", "!=", "<=>", "#!", "%%", "//",
    ]
    special = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|im_start|>user\nHello!<|im_end|>\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "Text before <|endoftext|> text after",
        "The token<|endoftext|>is glued",
        "two specials<|im_end|><|im_start|>adjacent",
        " <|im_start|> spaced ",
        "<|im_start|<|im_end|>",
        "<|im_star|> misspelled special",
        "<|IM_START|> wrong case",
        "< |im_start| > broken special",
        "<repo_name>tensorfold<file_sep>src/lib.rs",
        "<filename>main.py\n<gh_stars>100",
        "<jupyter_start><jupyter_code>print(1)<jupyter_output>1",
        "<empty_output>",
        "<issue_start>bug<issue_comment>fix<issue_closed>",
        "<|endoftext|><|endoftext|><|endoftext|>",
        "Say <|im_end|> and stop.",
    ]
    leading = [
        " a", "  a", "   a", " 1", " !", " 你好", " 😀", " <|im_start|>", "\ta", "\na", " \na", "\n a",
        " The", "The", "  The", " the", " THE",
    ]
    prose = [
        "Once upon a time, in a land far, far away, there lived a tokenizer.",
        "Machine learning models process text as sequences of integers called tokens.",
        "The mitochondria is the powerhouse of the cell.",
        "She sells seashells by the seashore; the shells she sells are surely seashells.",
        "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
        "ALL CAPS SENTENCE WITH NUMBERS 123 AND SYMBOLS #@!",
        "camelCaseIdentifier snake_case_identifier kebab-case-identifier PascalCase",
        "Mr. Smith went to Washington D.C. on Jan. 5th at 3 p.m.",
        "Q: What is 2+2?\nA: 4.",
        "Dear Sir/Madam,\n\nI am writing to inquire...\n\nSincerely,\nA. Person",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor.",
        "Les élèves étudient à l'école depuis 8 h.",
        "Der schnelle braune Fuchs springt über den faulen Hund.",
        "El niño comió una manzana en la mañana.",
        "Мы учимся токенизации текста.",
        "This is a sentence. This is another one! And a third? Yes.",
        "a b c d e f g h i j k l m n o p q r s t u v w x y z",
        "A B C D E F G H I J K L M N O P Q R S T U V W X Y Z",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "ab" * 40,
        "The year 1999 was followed by 2000, not 19100.",
        "He said, \"It's 5 o'clock somewhere.\"",
        "Tab\tseparated\tvalues\t1\t2\t3",
        "comma,separated,values,1,2,3",
        "   Indented paragraph with    irregular   spacing.   ",
    ]
    texts += contractions + numbers + unicode_texts + emoji + code + punctuation + special + leading + prose
    # Every byte value that is valid on its own as UTF-8 text, so each byte-level symbol is exercised.
    texts.append("".join(chr(c) for c in range(0x20, 0x7F)))
    texts.append("".join(chr(c) for c in range(0xA0, 0x100)))
    texts.append("".join(chr(c) for c in range(1, 0x20)))
    seen = set()
    unique = [t for t in texts if not (t in seen or seen.add(t))]
    assert len(unique) >= 200, len(unique)
    return unique


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "How are you? 😀\nTwo lines."},
    ],
    [{"role": "user", "content": "Write code:"}, {"role": "assistant", "content": "print('hi')"}],
]

# A short ChatML template for the no-model unit test in src/chat.rs.
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Exercises what HF templates lean on: trim/lstrip blocks, loop controls, namespace, Python methods, tojson.
FEATURES = """{{ bos_token }}
{%- set ns = namespace(count=0) %}
{% for message in messages %}
    {% if message.role == 'system' %}
        {% continue %}
    {% endif %}
    {% set ns.count = ns.count + 1 %}
[{{ loop.index }}] {{ message['role'].upper() }}: {{ message.content.strip() | tojson }}
    {% if message.content.startswith('stop') %}{% break %}{% endif %}
{% endfor %}
{{ ns.count }} shown{{ eos_token }}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}"""

FEATURE_MESSAGES = [
    {"role": "system", "content": "hidden"},
    {"role": "user", "content": "  Hi \"there\" <b> ünï  "},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "stop here"},
    {"role": "assistant", "content": "never shown"},
]


def main():
    model = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["TF_MODEL"])
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(__file__).resolve().parent.parent / "tests/data/tokenizer_smollm2.json"
    tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)

    # The model's own tokenizer.json pipeline: the same vocabulary and merges, digits split one by one.
    trained = tokenizers.Tokenizer.from_str(tok.backend_tokenizer.to_str())
    trained.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    )

    cases = []
    for text in corpus():
        ids = tok.encode(text, add_special_tokens=False)
        case = {"text": text, "ids": ids, "decoded": tok.decode(ids)}
        trained_ids = trained.encode(text, add_special_tokens=False).ids
        if trained_ids != ids:
            case["tokenizer_json_ids"] = trained_ids
        cases.append(case)

    chat = []
    for messages in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
            chat.append({"messages": messages, "add_generation_prompt": add_generation_prompt, "text": text})

    def render(template, messages, add_generation_prompt):
        rendered, _ = render_jinja_template(
            conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt,
            bos_token="<s>", eos_token="</s>",
        )
        return rendered[0]

    inline = [
        {"template": "chatml", "messages": CONVERSATIONS[2], "add_generation_prompt": True,
         "text": render(CHATML, CONVERSATIONS[2], True)},
        {"template": "features", "messages": FEATURE_MESSAGES, "add_generation_prompt": True,
         "text": render(FEATURES, FEATURE_MESSAGES, True)},
    ]

    data = {
        "model": model.name,
        "reference": f"transformers {transformers.__version__} AutoTokenizer(gguf_file), tokenizers {tokenizers.__version__}",
        "bos_id": tok.bos_token_id,
        "eos_id": tok.eos_token_id,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "chat_template": tok.chat_template,
        "cases": cases,
        "chat": chat,
        "inline_chat": inline,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n")
    num_quirks = sum("tokenizer_json_ids" in c for c in cases)
    print(f"{out}: {len(cases)} cases ({num_quirks} where the GGUF loader differs), {len(chat)} chat goldens")


if __name__ == "__main__":
    main()
