#!/usr/bin/env python3
"""Builds benches/data/chat-prompts.jsonl: unique chat prompts whose natural answers vary in
length, from a haiku to a long story, for benchmarks that let the model end its own outputs
(no ignore_eos). Deterministic: the same file on every run.

usage: benches/scripts/make-chat-prompts.py [OUT] [N]
The output_len of each line is filled in later by benches/scripts/natural-lengths.py (the
length the default model's greedy answer actually has); here it is absent.
"""
import json
import random
import sys

TOPICS = [
    "the ocean", "autumn leaves", "a lighthouse", "coffee", "the moon landing", "volcanoes", "honeybees",
    "the Roman Empire", "black holes", "photosynthesis", "a rainy city", "chess", "the printing press",
    "jazz music", "mountain climbing", "a lost key", "the internet", "glaciers", "a friendly robot",
    "ancient Egypt", "tea ceremonies", "solar panels", "a busy train station", "dinosaurs", "the desert at night",
    "a small bakery", "penguins", "the human heart", "recycling", "a thunderstorm", "origami", "the Silk Road",
    "electric cars", "a garden in spring", "whales", "the first computer", "a snowy village", "bicycles",
    "the water cycle", "a forgotten library", "migrating birds", "earthquakes", "a street market", "coral reefs",
    "the Eiffel Tower", "sleep", "a night sky full of stars", "bread making", "the Amazon rainforest", "kites",
    "an old violin", "the Great Wall of China", "rivers", "friendship", "a space station", "pirates", "mushrooms",
    "the Olympic Games", "a quiet lake", "bridges", "owls", "the telephone", "a marathon", "clouds", "castles",
    "vaccines", "a summer festival", "maps", "tigers", "a windmill", "the alphabet", "lightning", "deserts",
    "a haunted house", "clocks", "butterflies", "the stock market", "a cup of hot chocolate", "submarines",
    "rainbows", "a school trip", "satellites", "the Arctic", "gardening", "wolves",
]

TEMPLATES = [
    "Write a haiku about {t}.",
    "Give me one sentence about {t}.",
    "What is the most interesting fact about {t}? Answer briefly.",
    "List five facts about {t}.",
    "Explain {t} to a ten-year-old.",
    "Write a short poem about {t}.",
    "Describe {t} in one paragraph.",
    "Write a short story about {t}.",
    "Explain in detail how {t} works or came to be.",
    "Write an essay about {t} with an introduction, three sections and a conclusion.",
    "Give me three questions a student might ask about {t}, with answers.",
    "Write a dialogue between two friends talking about {t}.",
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "benches/data/chat-prompts.jsonl"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 600
    prompts = [tpl.format(t=t) for t in TOPICS for tpl in TEMPLATES]
    random.Random(20261201).shuffle(prompts)
    with open(out, "w") as f:
        for p in prompts[:n]:
            f.write(json.dumps({"prompt": p}) + "\n")
    print(f"wrote {min(n, len(prompts))} of {len(prompts)} prompts to {out}")


if __name__ == "__main__":
    main()
