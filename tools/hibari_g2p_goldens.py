#!/usr/bin/env python3
"""Reference phonemes and ids of the hibari voice's English front end, for tests/hibari_g2p.rs.

    python3 -m pip download --no-deps hibari-tts==0.2.1 -d WHEELS && unzip WHEELS/*.whl -d WHEEL
    hibari_g2p_goldens.py --wheel WHEEL [--out tests/data/hibari/g2p.json]
    hibari_g2p_goldens.py --wheel WHEEL --corpus LINES.txt --out /tmp/big.json   # then, to compare:
    HIBARI_G2P_GOLDENS=/tmp/big.json cargo test --release --test hibari_g2p

Needs numpy and onnxruntime (the wheel's OOV network runs in onnxruntime). Runs the wheel's own
`Hibari.phonemize` and `Hibari.ids` (US English, voice "heart") on the corpus below, without loading
the acoustic network, and writes per input its phoneme chunks and their ids. It also records the OOV
network's reading of the made-up words on their own, so a mismatch can be told apart from the rules.
"""

import argparse
import json
import pathlib
import sys

SENTENCES = [
    # Plain sentences.
    "Hello there.",
    "The quick brown fox jumps over the lazy dog.",
    "She sells sea shells by the sea shore.",
    "How are you doing today?",
    "Wait, what did you just say?",
    "I can't believe it's already Friday!",
    "Please call me back when you get this message.",
    "Rain is expected later this evening.",
    "Turn left at the next light, then keep going straight.",
    "Yes.",
    "No, thank you.",
    "Music fills the quiet room.",
    "An apple a day keeps the doctor away.",
    "The owl and the eagle flew to an island in the east.",
    "I am going to the store, and I am going to buy eggs.",
    "Am I late?",
    "He was used to the cold, but he used a blanket anyway.",
    "It's used to cut paper.",
    "They went in, and then they came back in.",
    "Stand by, the car drove by slowly.",
    "The end of the story was the best part.",
    "To be, or not to be, that is the question.",
    "Go to it and go to bed.",
    # Cardinals, decimals, negatives.
    "I have 3 cats and 12 dogs.",
    "There were 1,250 people in the hall.",
    "The population is 7,900,000,000 and growing.",
    "Pi is about 3.14159.",
    "The temperature dropped to -5 overnight.",
    "He scored 0.5 points more than me.",
    "Add 2.50 to .75 and you get 3.25.",
    "The answer is 42.",
    "Count from 1 to 10 slowly.",
    "There are 101 dalmatians and 1001 nights.",
    "It costs 100 dollars or 1000 euros.",
    "The code is 007.",
    "We need 15 more chairs, not 16.",
    "Version 2.0.1 was released.",
    "The ratio was 3-2 in the final.",
    "Pages 10-20 are missing.",
    "He was born in 1984.",
    "The year 2000 was a leap year.",
    "In 1905 and 2010 things changed, and in 1800 too.",
    "The 1990s were loud and the 80s were louder.",
    "She lived from 1066 to 1087.",
    "Call 555-123-4567 now.",
    "My extension is 867-5309.",
    "It weighs 12.5 kg and is 30 cm long.",
    "The car goes 60 mph on a 5 km road.",
    "Download 4 GB over a 100 Mbps link.",
    "It was 72°F outside and 22 °C inside.",
    "Water boils at 100°C.",
    "Use 2 tsp of salt.",
    "She ran 26.2 mi in 3 hrs.",
    "The screen is 1920x1080.",
    "He finished 1st, she was 2nd, and they were 3rd and 4th.",
    "It is the 21st century.",
    "This is my 100th attempt.",
    "On the 22nd of May we leave.",
    "Half of them, 1/2, came; 3/4 stayed; 2/3 left.",
    "Mix 1/3 cup of flour.",
    "The score is 7/9.",
    "About 50% of people agree, and 12.5% disagree.",
    "Prices rose by 3.5 percent.",
    "Number 7 is lucky, No. 9 is not.",
    "Room #12 is upstairs.",
    "Call +1 555 0100.",
    "A 3-year-old child and a 10-minute walk.",
    "We sold 2x more this year.",
    "1 2 3 4 5.",
    # Currency.
    "It costs $5.",
    "That will be $9.99, please.",
    "He paid $1,250.50 for it.",
    "The ticket was $0.50.",
    "Only $1 and $2.01 left.",
    "The company raised $3 million.",
    "Revenue hit $4.5B last year.",
    "She earned £200 and €1,000.",
    "A coffee costs £3.20.",
    "It costs ¥500.",
    "He owes me 50¢.",
    "It was 100 USD.",
    "Rs. 250 is the price.",
    "They spent $10k on ads.",
    # Times and dates.
    "The meeting starts at 9:30.",
    "Wake me at 7:05 am.",
    "The train leaves at 10:00 PM.",
    "It ended at 12:45:30.",
    "See you at 3pm.",
    "We met at 11 a.m. sharp.",
    "The deadline is 5:00.",
    "On 3/14/2015 we celebrated.",
    "It happened on 2021-07-04.",
    "Her birthday is Jan. 5th.",
    "The event is on March 3, 2024.",
    "We arrived on December 25th.",
    "She left on the 4th of July.",
    "It was 12 October 1492.",
    "Sept 11 is remembered.",
    "From Mon. to Fri. we work.",
    # Abbreviations and titles.
    "Dr. Smith lives on Elm St. downtown.",
    "Mr. and Mrs. Jones went to St. Paul.",
    "Ms. Lee met Prof. Brown.",
    "Gen. Patton and Capt. Kirk.",
    "Mt. Everest is tall.",
    "The firm, Acme Inc., is approx. 50 years old.",
    "See fig. 3 and vol. 2.",
    "Apple vs. Samsung was a big case.",
    "Jr. and Sr. are suffixes.",
    "I live at 221B Baker St.",
    "The U.S.A. and the U.K. signed it.",
    "e.g. this, i.e. that, etc.",
    "J. K. Rowling wrote it.",
    "Henry VIII had six wives.",
    "Read Chapter IV tonight.",
    "World War II ended in 1945.",
    "Pope John Paul II visited.",
    "Louis XIV was a king.",
    "BTW, the results are TBD.",
    "It's 5 ft tall, aka short.",
    # Heteronyms.
    "I read the book yesterday, and I will read it again.",
    "Please read this aloud.",
    "She has read every page.",
    "Lead is a heavy metal.",
    "They lead the way.",
    "I live in a house near the live music venue.",
    "We watched the live broadcast.",
    "Wind the clock before the wind gets stronger.",
    "A tear rolled down her cheek as she began to tear the letter.",
    "Don't tear it.",
    "Record the record.",
    "She set a new world record.",
    "Please record the meeting.",
    "I present you with this present.",
    "The present moment matters.",
    "I object to that object.",
    "Close the door, it is close to midnight.",
    "Wait a minute, that is a minute detail.",
    "The bass swam near the bass player.",
    "He plays bass guitar.",
    "Does he have two does?",
    "They refuse to take out the refuse.",
    "The dove dove into the bushes.",
    "We must polish the Polish furniture.",
    "The wound was wound tightly.",
    "He will produce fresh produce.",
    "Can you desert your post in the desert?",
    "The contract says to contract the muscle.",
    "Increase the increase.",
    "I used to live there.",
    "Permit me to see your permit.",
    "Do not subject the subject to that.",
    "The invalid was invalid.",
    # Punctuation of every kind.
    "\"Hello,\" she said, \"how are you?\"",
    "“Curly quotes” are used ‘here’ too.",
    "Wait... what?",
    "Well… I guess so.",
    "It was—how shall I put it—unexpected.",
    "It was -- in a word -- odd.",
    "The range is 5–10 meters.",
    "He said (quietly) that he was done.",
    "Note: this is important; read it.",
    "Really?! No way!",
    "Items: apples, pears, and plums.",
    "[Brackets] and {braces} too.",
    "Stars *like this* and under_scores.",
    "A/B testing and either/or choices.",
    "Tom & Jerry.",
    "R&D spending is up.",
    "5 + 3 = 8.",
    "x < y and y > z.",
    "It is ~10 km away.",
    "Email me at john.doe@example.com today.",
    "Visit https://www.example.com/page for more.",
    "Go to example.org now.",
    "The #1 hit song.",
    "Use the @ sign.",
    "50/50 chance.",
    "Ice|cream.",
    "It costs ~$20.",
    "Hmm...",
    "'Quoted' words and 'single quotes.'",
    "Ha! Ha! Ha!",
    # Capitals and all caps.
    "NASA launched a rocket.",
    "The FBI and the CIA met at the UN.",
    "I LOVE THIS SONG.",
    "STOP RIGHT THERE!",
    "The CEO of IBM spoke.",
    "He works at AT&T.",
    "She said OK.",
    "It is an NFL game.",
    "TO BE OR NOT TO BE.",
    "THE END.",
    "McDonald's and iPhone and eBay.",
    "He is a PhD student at MIT.",
    "I need a USB cable.",
    "The DNA test was positive.",
    "It's A-OK.",
    "Press CTRL to continue.",
    "ReadMe files and JavaScript code.",
    # Hyphens, contractions, possessives.
    "A well-known self-driving car.",
    "The state-of-the-art twenty-first-century design.",
    "My mother-in-law is forty-two.",
    "Don't, won't, can't, shouldn't, and wouldn't.",
    "I'm sure you'll like it; we've tried it, they'd say.",
    "It's John's car, not the Smiths' house.",
    "The children's toys and the boss's office.",
    "Y'all ain't seen nothin' yet.",
    "Rock 'n' roll never dies.",
    "Let's go, ma'am.",
    "The '90s were fun.",
    "O'Brien and D'Angelo met.",
    "He's gonna wanna go.",
    "It's a pre-existing co-op.",
    "An e-mail about X-rays.",
    # Unknown and made-up words.
    "The zorblax flimmered across the quantaloop.",
    "Grumbletoes and snickerwump went shopping.",
    "She fed the blorptastic wibbleflanks.",
    "Xyloquent phrentix yondered.",
    "The glimmerbock sang to the vorpaline.",
    "A trundlequist met a snargle.",
    "Kwazimodo plinked the flurbex.",
    "They visited Zyxtopolis and Quenderhaven.",
    "The skrimble droofed.",
    "Mister Plonkwhistle owns a frangulator.",
    "Thwimbly and zenthrop are not words.",
    "The bloopity snorfed.",
    "Vrellish gandermoots abound.",
    "Yarbleflex cromulence embiggens.",
    "Schmorgelbrat is a dish.",
    "Ptolemaic zquorble.",
    "The word is floofenstein.",
    "Ngozi and Xiomara visited Tbilisi.",
    "Sriracha and gochujang and tzatziki.",
    "Qwertyuiop asdfghjkl.",
    "Dwimmerlaik and eldritchian.",
    "The crumpetorium opened.",
    "Blibberjab's shop.",
    "Snozzcumbers are gross.",
    "Frobnicating the widgetron.",
    "Café naïve résumé.",
    "ZORBLAX is loud.",
    "The gloobers zigzagged.",
    "It was blorping.",
    "Unfrizzleable hair.",
    "abc123 and x2y and 4ever.",
    "The R2D2 unit and C3PO.",
    "B2B and P2P deals.",
    "Meet me 2morrow at the 2nd gate.",
    # Letters, initials, spelled-out things.
    "A is for apple.",
    "Plan A and plan B.",
    "The letter a and the letter Z.",
    "I, me, and myself.",
    "Vitamin D and type O blood.",
    # Mixed.
    "On Monday, Dr. Lee paid $12.50 at 5:45 pm for 3 coffees.",
    "In 2023, 45% of the 1,200 respondents said yes.",
    "The 3rd runner finished in 2:05:30.",
    "Apt. 4B, 221 Baker Street, London.",
    "Tickets cost $25 each, or $40 for two.",
]

PARAGRAPHS = [
    "Hello there. How are you? I'm fine, thanks! See you later.",
    "Dr. Smith arrived at 9 a.m. He was late. Mr. Brown was not amused.",
    "J. R. R. Tolkien wrote books. They are long.\nThis is a new line.\n\nAnd a new paragraph.",
    "The meeting is over. \"Good,\" she said. (Finally.) Everyone left... Then the lights went out!",
    "It cost $3.50. That's cheap. what a deal. Right?",
    "First, we read. Second, we write. Third, we rest. Fourth, we start again.",
    "Wait… Really? Yes! The end.",
]

LONG = [
    "This is a very long sentence that goes on and on, with many clauses and commas, so that the phoneme "
    "string grows past the limit that the model can take at once; it keeps going with more words, more "
    "ideas, and more pauses, because we want to see where the splitter cuts it: at commas, at semicolons, "
    "at colons, and at dashes — wherever it can, and then it continues for a while longer, adding detail "
    "after detail, until at last, after what feels like an eternity of words, it finally comes to an end.",
    "Numbers in a long sentence, like 1,234 and 5,678 and 9,101, and dates like January 1st, 2020, and "
    "times like 10:30 am, and prices like $45.67 and $89.01, and percentages like 12% and 34%, all add up "
    "to a long string of phonemes; the splitter should still cut it at the punctuation, and each part "
    "should stay below the limit, even though there are so many numbers, words and symbols to read aloud.",
]

OOV_WORDS = [
    "zorblax", "flimmered", "quantaloop", "Grumbletoes", "snickerwump", "blorptastic", "wibbleflanks",
    "Xyloquent", "phrentix", "glimmerbock", "vorpaline", "trundlequist", "Kwazimodo", "flurbex",
    "Zyxtopolis", "Quenderhaven", "skrimble", "Plonkwhistle", "frangulator", "Thwimbly", "zenthrop",
    "Vrellish", "gandermoots", "Yarbleflex", "Schmorgelbrat", "zquorble", "floofenstein", "Dwimmerlaik",
    "crumpetorium", "widgetron", "Qwertyuiop", "asdfghjkl", "Ngozi", "ZORBLAX", "naïve",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True, help="directory holding the unpacked wheel (its hibari/)")
    ap.add_argument("--out", default="tests/data/hibari/g2p.json")
    ap.add_argument("--corpus", help="a text file, one input per line, instead of the built-in corpus")
    args = ap.parse_args()
    sys.path.insert(0, str(pathlib.Path(args.wheel).resolve()))
    from hibari.g2p import G2P
    from hibari.tts import Hibari, ASSETS

    tts = Hibari.__new__(Hibari)
    tts.voice = "heart"
    tts._g2p = G2P(british=False)
    with open(pathlib.Path(ASSETS) / "vocab.json", encoding="utf-8") as f:
        tts.vocab = json.load(f)

    corpus = (("sentence", SENTENCES), ("paragraph", PARAGRAPHS), ("long", LONG))
    if args.corpus:
        with open(args.corpus, encoding="utf-8") as f:
            corpus = (("line", [line.rstrip("\n") for line in f if line.strip()]),)
    cases = []
    for kind, texts in corpus:
        for text in texts:
            chunks = tts.phonemize(text)
            cases.append({"kind": kind, "text": text, "phonemes": chunks, "ids": [tts.ids(c) for c in chunks]})
    oov = [{"word": w, "phonemes": tts.g2p.oov(w)} for w in OOV_WORDS]
    out = {"wheel": "hibari-tts==0.2.1", "voice": "heart", "cases": cases, "oov": oov}
    path = pathlib.Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    num_split = sum(len(c["phonemes"]) > 1 for c in cases if c["kind"] == "long")
    print(f"{len(cases)} inputs, {len(oov)} OOV words, "
          f"{num_split} long inputs split, {path.stat().st_size} bytes -> {path}")


if __name__ == "__main__":
    main()
