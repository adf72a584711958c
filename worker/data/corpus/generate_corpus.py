#!/usr/bin/env python3
"""Writes generated_stories.txt: English-like prose from a small hand-written grammar.

Part of the demo corpus that `longhaul-worker train` embeds (see ../prepare.h). The output is
deterministic (a fixed linear congruential generator, no library randomness), so re-running this
script reproduces the committed file byte for byte:

    python3 worker/data/corpus/generate_corpus.py
"""
import os

TARGET_BYTES = 1_600_000


class Lcg:
    """Knuth's MMIX LCG; the top bits are good enough to pick words."""

    def __init__(self, seed):
        self.state = seed

    def below(self, n):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return (self.state >> 33) % n

    def pick(self, items):
        return items[self.below(len(items))]


NAMES = ["Ada", "Bram", "Cleo", "Dario", "Esme", "Farid", "Greta", "Hugo", "Ines", "Jonah",
         "Kira", "Lev", "Mira", "Nils", "Odile", "Pavel", "Quinn", "Rosa", "Soren", "Tamsin"]
PLACES = ["the harbour", "the old station", "the valley", "the northern pass", "the market",
          "the lighthouse", "the long bridge", "the river town", "the depot", "the orchard",
          "the mountain village", "the signal box", "the quiet library", "the freight yard"]
NOUNS = ["train", "lantern", "letter", "map", "engine", "ledger", "compass", "bell", "clock",
         "garden", "notebook", "ticket", "kettle", "window", "bicycle", "radio", "boat", "key"]
ADJS = ["old", "small", "bright", "quiet", "heavy", "careful", "patient", "narrow", "warm",
        "steady", "distant", "early", "late", "broken", "golden", "grey", "long", "simple"]
VERBS_T = ["carried", "repaired", "found", "painted", "counted", "opened", "watched", "mended",
           "checked", "wrote", "borrowed", "cleaned", "packed", "followed", "measured", "saved"]
VERBS_I = ["waited", "laughed", "listened", "worked", "rested", "walked", "sang", "travelled",
           "returned", "slept", "smiled", "wondered", "hurried", "paused"]
ADVS = ["slowly", "quietly", "again", "carefully", "at last", "before dawn", "after supper",
        "every morning", "in the rain", "without a word", "once more", "for a long time"]
TIMES = ["On Monday", "In the evening", "Later that week", "Before the storm", "At noon",
         "In the spring", "One winter night", "Early the next day", "After the long journey",
         "When the bells rang", "While the kettle boiled", "Years later"]
CONNECTIVES = ["because", "although", "while", "until", "after", "before", "so that"]
SAYINGS = ["A checkpoint saved is a day not lost.", "Slow and steady keeps the fire lit.",
           "Count twice and write once.", "Every long road is walked one step at a time.",
           "The patient engine climbs the hill.", "Write it down before you forget it.",
           "A quiet station hears every train.", "Mend the net before the tide comes in."]


class Grammar:
    def __init__(self, rng):
        self.r = rng

    def np(self):
        r = self.r
        form = r.below(4)
        if form == 0:
            return r.pick(NAMES)
        if form == 1:
            return "the " + r.pick(ADJS) + " " + r.pick(NOUNS)
        if form == 2:
            return r.pick(NAMES) + "'s " + r.pick(NOUNS)
        return "a " + r.pick(NOUNS) + " from " + r.pick(PLACES)

    def clause(self):
        r = self.r
        if r.below(2) == 0:
            return f"{r.pick(NAMES)} {r.pick(VERBS_T)} {self.np()}"
        return f"{r.pick(NAMES)} {r.pick(VERBS_I)} {r.pick(ADVS)} near {r.pick(PLACES)}"

    def sentence(self):
        r = self.r
        form = r.below(7)
        if form == 0:
            s = f"{r.pick(TIMES)}, {self.clause()}."
        elif form == 1:
            s = f"{self.clause()} {r.pick(CONNECTIVES)} {self.clause()}."
        elif form == 2:
            count = 2 + r.below(9)
            s = (f"{r.pick(NAMES)} counted {count} {r.pick(NOUNS)}s at {r.pick(PLACES)} "
                 f"and wrote the number in a {r.pick(ADJS)} notebook.")
        elif form == 3:
            s = f'"{r.pick(SAYINGS)}" said {r.pick(NAMES)}.'
        elif form == 4:
            s = f"Was it {self.np()} that {r.pick(NAMES)} {r.pick(VERBS_T)}? Nobody knew."
        elif form == 5:
            s = f"{self.clause()}, and then {self.clause()}."
        else:
            s = f"{self.clause()} {r.pick(ADVS)}."
        return s[0].upper() + s[1:]

    def paragraph(self):
        return " ".join(self.sentence() for _ in range(3 + self.r.below(5)))

    def story(self, number):
        r = self.r
        title = f"Story {number}: The {r.pick(ADJS).title()} {r.pick(NOUNS).title()}"
        paragraphs = [self.paragraph() for _ in range(2 + r.below(4))]
        return title + "\n\n" + "\n\n".join(paragraphs) + "\n\n"


def main():
    grammar = Grammar(Lcg(20240520))
    parts, size, number = [], 0, 1
    while size < TARGET_BYTES:
        story = grammar.story(number)
        parts.append(story)
        size += len(story.encode())
        number += 1
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "generated_stories.txt")
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(parts))
    print(f"wrote {out}: {size} bytes, {number - 1} stories")


if __name__ == "__main__":
    main()
