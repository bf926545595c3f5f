"""Independent oracle for cedar's Engram row ids (src/model/engram_hash.h NgramHasher), in plain
Python integers: no numpy, no torch. Restates engram.py NgramHashState.forward for the released
V4.1 Engram config with a synthetic compressed token map (token t -> t mod 99092), so that no
tokenizer is needed. The multipliers are the released values of spec §4.3 (typed in, not computed),
the primes are found here by trial division. Writes tests/model/data/engram_hash_oracle.json:

    python3 tools/oracles/engram_hash_oracle.py > tests/model/data/engram_hash_oracle.json
"""

import json
import sys

LAYER_IDS = [1, 14]
MAX_NGRAM = 4
N_HEADS = 8
ENGRAM_VOCAB = 16000000
COMPRESSED_VOCAB = 99092
RAW_VOCAB = 129280
PAD_TOKEN = 2
MULTIPLIERS = [  # spec §4.3, layer 1 and layer 14
    [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    [67716810739261, 51510806800915, 30921347202721, 82619226485591],
]
DEAD = -1


def is_prime(n):
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def layer_primes():
    """[layer][order-2][head]: each (layer, order) restarts at ENGRAM_VOCAB-1 and takes the next
    primes never handed out before."""
    seen, out = set(), []
    for _ in LAYER_IDS:
        orders = []
        for _ in range(MAX_NGRAM - 1):
            cur, heads = ENGRAM_VOCAB - 1, []
            for _ in range(N_HEADS):
                cur += 1
                while not is_prime(cur) or cur in seen:
                    cur += 1
                seen.add(cur)
                heads.append(cur)
            orders.append(heads)
        out.append(orders)
    return out


def to_int64(v):
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= (1 << 63) else v


def token_map(t):
    return t % COMPRESSED_VOCAB


def rows_for(tokens, text_flags, primes):
    pad = token_map(PAD_TOKEN)
    history = [token_map(t) if f else DEAD for t, f in zip(tokens, text_flags)]
    result = []
    for i in range(len(tokens)):
        u, blocked = [], False
        for k in range(MAX_NGRAM):
            if i - k < 0 or history[i - k] == DEAD:
                blocked = True
            u.append(pad if blocked else history[i - k])
        per_layer = []
        for layer in range(len(LAYER_IDS)):
            m = MULTIPLIERS[layer]
            flat = [p for order in primes[layer] for p in order]
            offsets = [sum(flat[:c]) for c in range(len(flat))]
            rolling = to_int64(u[0] * m[0])
            cols = []
            for n in range(1, MAX_NGRAM):
                rolling = to_int64(rolling ^ to_int64(u[n] * m[n]))
                for h in range(N_HEADS):
                    c = (n - 1) * N_HEADS + h
                    cols.append(offsets[c] + rolling % flat[c])  # Python % = torch's int64 %
            per_layer.append(cols)
        result.append(per_layer)
    return result


def lcg(seed):
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield state >> 33


def main():
    primes = layer_primes()
    seqs = []
    # A: text only; ids above the compressed vocab (they wrap in the synthetic map), the pad token
    # itself and token 0.
    seqs.append(("text_only", [0, 15, 99091, 99092, 2, 129279, 7, 7, 7, 100000, 42, 1],
                 [1] * 12))
    # B: an image span at the very start and one in the middle.
    tok_b = [129264, 129264, 129264, 500, 501, 502, 503, 504, 505, 506, 507, 129264, 129264, 129264,
             600, 601, 602, 603, 604, 605, 606]
    flags_b = [0, 0, 0] + [1] * 8 + [0, 0, 0] + [1] * 7
    seqs.append(("image_spans", tok_b, flags_b))
    # C: pseudo-random tokens, about one in seven an isolated image token.
    g = lcg(2026)
    tok_c, flags_c = [], []
    for _ in range(40):
        tok_c.append(next(g) % RAW_VOCAB)
        flags_c.append(0 if next(g) % 7 == 0 else 1)
    seqs.append(("random", tok_c, flags_c))

    out = {"layer_ids": LAYER_IDS, "multipliers": [[str(v) for v in m] for m in MULTIPLIERS],
           "raw_vocab": RAW_VOCAB, "compressed_vocab": COMPRESSED_VOCAB, "pad_token": PAD_TOKEN,
           "first_primes": [primes[0][0][0], primes[1][2][7]], "sequences": []}
    for name, toks, flags in seqs:
        out["sequences"].append({"name": name, "tokens": toks, "text": flags,
                                 "rows": rows_for(toks, flags, primes)})
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
