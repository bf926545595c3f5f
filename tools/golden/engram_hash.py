"""Engram n-gram hashing of the V4.1 reference (inference/engram.py semantics, spec 4.3).

Three pieces, each derived from the config and the checkpoint's tokenizer.json:
* the compressed token map: every token id -> class id of its normalised text (Python `tokenizers`
  normalisers, the chain of spec 4.3), classes numbered in order of first appearance;
* the bucket primes: per Engram layer, per n-gram order, per head, the next prime above
  `engram_vocab_size - 1` never handed out before, and the exclusive prefix sums as row offsets;
* the multipliers: numpy default_rng(10007 * layer_id) (PCG64) integers, times 2 plus 1.
Hash ids for a position combine the compressed ids of the last `max_ngram_size` positions with
int64 multiply + XOR; the history of compressed ids persists across prefill/decode calls.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin: exact for every n < 3.3e24 with the first 12 prime bases."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def engram_primes(n_layers: int, max_ngram_size: int, n_heads: int, vocab_size: int) -> list[list[list[int]]]:
    """[layer][n-gram order - 2][head] bucket moduli: each (layer, order) list restarts its search
    at vocab_size - 1, skipping primes already handed out anywhere."""
    seen: set[int] = set()
    layers = []
    for _ in range(n_layers):
        orders = []
        for _ in range(max_ngram_size - 1):
            current, sizes = vocab_size - 1, []
            for _ in range(n_heads):
                current += 1
                while not is_prime(current) or current in seen:
                    current += 1
                seen.add(current)
                sizes.append(current)
            orders.append(sizes)
        layers.append(orders)
    return layers


def hash_multipliers(layer_ids: list[int], max_ngram_size: int, compressed_vocab_size: int) -> list[list[int]]:
    """Per layer, `max_ngram_size` odd int64 multipliers bounded so id * m cannot overflow."""
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab_size) // 2)
    rows = []
    for layer_id in layer_ids:
        rng = np.random.default_rng(10007 * layer_id)
        values = rng.integers(low=0, high=bound, size=(max_ngram_size,), dtype=np.int64)
        rows.append([int(v) * 2 + 1 for v in values])
    return rows


def build_compressed_token_map(tokenizer_json: str) -> tuple[np.ndarray, int]:
    """Class id per token id of the tokenizer (len = vocab incl. added tokens), and the class count.
    A token whose decoded text has U+FFFD (a partial UTF-8 byte) is keyed by its raw token string."""
    from tokenizers import Regex, Tokenizer, normalizers

    sentinel = "\ue000"  # protects a token that is exactly " " from Strip()
    normalizer = normalizers.Sequence([
        normalizers.NFKC(),
        normalizers.NFD(),
        normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(),
        normalizers.Replace(sentinel, " "),
    ])
    tok = Tokenizer.from_file(tokenizer_json)
    n = tok.get_vocab_size(with_added_tokens=True)
    key_to_class: dict[str, int] = {}
    lookup = np.zeros(n, dtype=np.int64)
    for token_id in range(n):
        text = tok.decode([token_id], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(token_id)
        else:
            key = normalizer.normalize_str(text) or text
        cls = key_to_class.setdefault(key, len(key_to_class))
        lookup[token_id] = cls
    return lookup, len(key_to_class)


@dataclass
class EngramHasher:
    layer_ids: list[int]
    max_ngram_size: int
    n_heads: int
    primes: np.ndarray  # [n_layers, max_ngram-1, n_heads] int64
    offsets: np.ndarray  # [n_layers, (max_ngram-1)*n_heads] int64
    multipliers: np.ndarray  # [n_layers, max_ngram] int64
    token_map: np.ndarray  # [tokenizer vocab] int64
    pad_class: int

    @classmethod
    def from_config(cls, cfg, token_map: np.ndarray, class_count: int) -> "EngramHasher":
        if class_count != cfg.engram_compressed_vocab_size:
            raise ValueError(
                f"Engram: the tokenizer's normalised class count is {class_count} but config.json's "
                f"engram_compressed_vocab_size is {cfg.engram_compressed_vocab_size}; the hash multipliers derive "
                "from it, so the checkpoint and its tokenizer.json do not belong together (fix the config value "
                "or ship the matching tokenizer)")
        primes = engram_primes(len(cfg.engram_layer_ids), cfg.engram_max_ngram_size, cfg.engram_n_heads,
                               cfg.engram_vocab_size)
        offsets = []
        for i, layer in enumerate(primes):
            flat = [p for order in layer for p in order]
            if sum(flat) != cfg.engram_num_embeddings[i]:
                raise ValueError(
                    f"Engram layer {cfg.engram_layer_ids[i]}: the primes sum to {sum(flat)} rows but config.json's "
                    f"engram_num_embeddings[{i}] is {cfg.engram_num_embeddings[i]}")
            offsets.append(np.concatenate([[0], np.cumsum(flat)[:-1]]))
        return cls(
            layer_ids=list(cfg.engram_layer_ids),
            max_ngram_size=cfg.engram_max_ngram_size,
            n_heads=cfg.engram_n_heads,
            primes=np.array(primes, dtype=np.int64),
            offsets=np.array(offsets, dtype=np.int64),
            multipliers=np.array(hash_multipliers(cfg.engram_layer_ids, cfg.engram_max_ngram_size, class_count),
                                 dtype=np.int64),
            token_map=token_map,
            pad_class=int(token_map[cfg.engram_pad_id]),
        )


class EngramHashState:
    """History of compressed ids by absolute position, as the reference's `cache` buffer."""

    def __init__(self, hasher: EngramHasher):
        self.h = hasher
        self.history: list[int] = []

    DEAD = -1  # NgramHashState.DEAD: an image-span position, where every look-back stops

    def __call__(self, ids: list[int], start_pos: int, takes_part: list[bool] | None = None) -> np.ndarray:
        """Hash ids for positions start_pos.. of `ids`: [S, n_engram_layers, (max_ngram-1)*n_heads].
        takes_part: None (all text) or one flag per id, False for image-span positions (the
        reference's token_mask): those are stored DEAD, and a look-back that meets a DEAD position
        (or the sequence start) takes the pad class from there on."""
        h = self.h
        for t in ids:
            if not 0 <= t < len(h.token_map):
                raise ValueError(
                    f"Engram: token id {t} is outside the tokenizer's {len(h.token_map)} ids; the reference's "
                    "compressed-id lookup fails there (its vocab_size exceeds the tokenizer)")
        del self.history[start_pos:]
        if len(self.history) != start_pos:
            raise ValueError(f"Engram history has {len(self.history)} positions, call starts at {start_pos}")
        self.history.extend(int(h.token_map[t]) if takes_part is None or takes_part[i] else self.DEAD
                            for i, t in enumerate(ids))
        n_cols = (h.max_ngram_size - 1) * h.n_heads
        out = np.zeros((len(ids), len(h.layer_ids), n_cols), dtype=np.int64)
        for s in range(len(ids)):
            pos = start_pos + s
            # u_k = compressed id at pos - k, or the pad class before the sequence start
            tokens, blocked = [], False
            for k in range(h.max_ngram_size):
                blocked = blocked or pos - k < 0 or self.history[pos - k] == self.DEAD
                tokens.append(h.pad_class if blocked else self.history[pos - k])
            for li in range(len(h.layer_ids)):
                rolling = tokens[0] * int(h.multipliers[li, 0])
                for order in range(1, h.max_ngram_size):
                    rolling ^= tokens[order] * int(h.multipliers[li, order])
                    for head in range(h.n_heads):
                        col = (order - 1) * h.n_heads + head
                        out[s, li, col] = rolling % int(h.primes[li, order - 1, head]) + int(h.offsets[li, col])
        return out


def released_layout_check() -> dict:
    """The released config's values (spec 4.3) recomputed: 48 primes, the two row sums and the
    eight multipliers, to compare against the spec's published numbers."""
    primes = engram_primes(2, 4, 8, 16000000)
    mults = hash_multipliers([1, 14], 4, 99092)
    flat = [[p for order in layer for p in order] for layer in primes]
    return {"primes": flat, "sums": [sum(f) for f in flat], "multipliers": mults}


if __name__ == "__main__":
    print(json.dumps(released_layout_check()))
