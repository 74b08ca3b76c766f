"""Training text from Debian packages, fetched with the machine's own apt
sources (never committed): WordNet 3.0 glosses (package wordnet-base,
WordNet 3.0 licence) and the fortune cookie files (packages fortunes-min and
fortunes, BSD-style licence; the offensive sets are not in these packages),
and the word list of wamerican (SCOWL, permissive) for evaluating answers.
  python3 train/data.py --out DIR
writes DIR/{train,heldout}.txt (documents separated by a line holding only
"\\x1e"), DIR/words.txt (the word list) and DIR/chat-{train,heldout}.jsonl (one {"messages": [...]} per
line: a question about a word answered with its definition). Every 20th item
(by a hash of its text) is held out."""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import subprocess
import tempfile

PACKAGES = ["wordnet-base", "fortunes-min", "fortunes", "wamerican"]
SEP = "\x1e"
POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def fetch(cache):
    """Downloads and unpacks PACKAGES into cache/root (once)."""
    root = os.path.join(cache, "root")
    if os.path.isfile(os.path.join(root, "usr/share/dict/american-english")):
        return root
    os.makedirs(cache, exist_ok=True)
    subprocess.run(["apt-get", "download", *PACKAGES], cwd=cache, check=True)
    for deb in glob.glob(os.path.join(cache, "*.deb")):
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
    return root


def held_out(text):
    return hashlib.sha256(text.encode()).digest()[0] % 20 == 0


def wordnet(root):
    """(word, part of speech, definition, examples) per synset and lemma."""
    out = []
    for f in sorted(glob.glob(os.path.join(root, "usr/share/wordnet/data.*"))):
        for line in open(f, encoding="latin-1"):
            if line.startswith("  ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            parts = head.split()
            pos = POS.get(parts[2])
            n = int(parts[3], 16)
            words = [parts[4 + 2 * i].replace("_", " ") for i in range(n)]
            words = [re.sub(r"\([a-z]+\)$", "", w) for w in words]
            gloss = gloss.strip()
            examples = re.findall(r'"([^"]+)"', gloss)
            definition = re.split(r';\s*"', gloss)[0].strip().rstrip(";").strip()
            if not definition or not pos:
                continue
            out.append((words, pos, definition, examples))
    return out


def fortunes(root):
    out = []
    for f in sorted(glob.glob(os.path.join(root, "usr/share/games/fortunes/*"))):
        if f.endswith(".dat") or os.path.islink(f) or os.path.isdir(f):
            continue
        text = open(f, encoding="utf-8", errors="replace").read()
        for item in text.split("\n%\n"):
            item = item.strip("\n%")
            if item.strip() and "\ufffd" not in item:
                out.append(item.expandtabs(4).strip())
    return out


def entry_text(words, pos, definition, examples):
    head = words[0]
    s = f"{head} ({pos}): {definition}."
    if len(words) > 1:
        s += " Also: " + ", ".join(words[1:]) + "."
    for e in examples:
        s += f' Example: "{e}"'
    return s


QUESTIONS = [
    'What does "{w}" mean?',
    "What is the meaning of the word {w}?",
    "Define {w}.",
    "What does the {p} \"{w}\" mean?",
    "Can you tell me what {w} means?",
    "Explain the word {w}.",
]


def answer(w, pos, definition, examples):
    art = "an" if pos[0] in "aeiou" else "a"
    s = f'"{w}" is {art} {pos}: {definition}.'
    if examples:
        s += f' For example: "{examples[0]}"'
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--cache", default=os.path.join(os.path.expanduser("~"), ".cache", "megamoe", "train-debs"))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    root = fetch(a.cache)
    rng = random.Random(a.seed)
    docs = {"train": [], "heldout": []}
    chat = {"train": [], "heldout": []}
    for words, pos, definition, examples in wordnet(root):
        t = entry_text(words, pos, definition, examples)
        split = "heldout" if held_out(t) else "train"
        docs[split].append(t)
        w = words[0]
        q = rng.choice(QUESTIONS).format(w=w, p=pos)
        chat[split].append({"messages": [{"role": "user", "content": q},
                                         {"role": "assistant", "content": answer(w, pos, definition, examples)}]})
    for t in fortunes(root):
        docs["heldout" if held_out(t) else "train"].append(t)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(root, "usr/share/dict/american-english")) as src, open(os.path.join(a.out, "words.txt"), "w") as dst:
        dst.write(src.read())
    for split in docs:
        rng.shuffle(docs[split])
        with open(os.path.join(a.out, f"{split}.txt"), "w") as f:
            f.write(f"\n{SEP}\n".join(docs[split]) + "\n")
        with open(os.path.join(a.out, f"chat-{split}.jsonl"), "w") as f:
            for c in chat[split]:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        print(f"{split}: {len(docs[split])} documents, {len(chat[split])} chats,"
              f" {sum(map(len, docs[split]))} characters")


if __name__ == "__main__":
    main()
