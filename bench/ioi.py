"""Does SmolLM2 do the indirect-object task, and do its name movers look at the right name?

    python bench/ioi.py

100 prompts from templates in the manner of Wang et al. 2022 ("When Mary and John went to the
store, John gave a drink to"), names and places drawn with a fixed seed, each name one token. For
each prompt: the logit difference IO − S at the end (does the model prefer the indirect object?),
and each head's direct effect on it: the head's output at the last position, through the final
norm as the run scales it, onto the unembedding's IO − S direction. The three heads of largest
mean direct effect are the name-mover candidates; for each, the share of prompts in which its
weight from the last position on IO is larger than on S (both of S's mentions together). About 20 seconds on two cores.
"""

import random

import numpy as np
import torch

from mha_trace.runs.resolve import RunOptions, load

NAMES = ["Mary", "John", "Tom", "James", "Anna", "Sarah", "David", "Michael", "Emma", "Paul",
         "Kate", "Peter", "Lisa", "Mark", "Alice", "Bob", "Jack", "Laura", "Susan", "Daniel"]
PLACES = ["store", "park", "school", "garden", "office"]
OBJECTS = ["drink", "book", "ball", "bag", "gift", "key"]
TEMPLATES = ["When {io} and {s} went to the {place}, {s} gave a {obj} to",
             "When {s} and {io} went to the {place}, {s} gave a {obj} to",
             "After {io} and {s} went to the {place}, {s} handed a {obj} to",
             "Then, {s} and {io} had a long day at the {place}. {s} gave a {obj} to"]


def prompts(n: int = 100, seed: int = 0) -> list[tuple[str, str, str]]:
    g = random.Random(seed)
    out = []
    for i in range(n):
        io, s = g.sample(NAMES, 2)
        text = TEMPLATES[i % len(TEMPLATES)].format(io=io, s=s, place=g.choice(PLACES), obj=g.choice(OBJECTS))
        out.append((text, io, s))
    return out


def main() -> None:
    model = load(RunOptions(model="smollm2"))
    H, L = model.heads, model.layers
    diffs, effects, looks = [], [], []
    with model.resident(), torch.no_grad():
        for text, io, s in prompts():
            ids, tokens, _ = model.pieces(text)
            io_id, s_id = model.tokenize(" " + io)[0], model.tokenize(" " + s)[0]
            contexts, final = [], []
            hooks = [model.attention_module(l).W_o.register_forward_pre_hook(
                lambda _, a: contexts.append(a[0][0, -1].clone())) for l in range(1, L + 1)]
            hooks.append(model.norm.register_forward_pre_hook(lambda _, a: final.append(a[0][0, -1].clone())))
            try:
                hidden, inputs, weights = model.run(ids)
            finally:
                for h in hooks:
                    h.remove()
            logits = model.logits(hidden)[0]
            diffs.append(float(logits[io_id] - logits[s_id]))
            direction = _direction(model, io_id, s_id)
            scale = model.norm.weight / final[0].pow(2).mean().add(model.norm.eps).sqrt()  # the norm, frozen
            row = []
            for l in range(L):
                a = model.attention_module(l + 1)
                d = a.d_k
                out = [(contexts[l][h * d:(h + 1) * d] @ a.W_o.weight[:, h * d:(h + 1) * d].T) for h in range(H)]
                row.append([float((o * scale) @ direction) for o in out])
            effects.append(row)
            at_io = [i for i, t in enumerate(tokens) if t.strip("␣") == io]
            at_s = [i for i, t in enumerate(tokens) if t.strip("␣") == s]  # S1 and S2
            looks.append(torch.stack([torch.stack([w[0, :, -1, at_io[0]], w[0, :, -1, at_s[0]],
                                                   w[0, :, -1, at_s[-1]]], -1)
                                      for w in weights]).numpy())  # (L, H, 3): IO, S1, S2
    diffs, effects, looks = np.array(diffs), np.array(effects), np.array(looks)  # (P,), (P, L, H), (P, L, H, 3)
    print(f"logit(IO) - logit(S) > 0 on {np.mean(diffs > 0):.0%} of {len(diffs)} prompts "
          f"(median {np.median(diffs):+.2f})")
    mean = effects.mean(0)
    for i in np.argsort(-mean.ravel())[:3]:
        l, h = divmod(int(i), H)
        io_w, s1, s2 = looks[:, l, h].mean(0)
        above = np.mean(looks[:, l, h, 0] > looks[:, l, h, 1:].sum(-1))
        print(f"head {l + 1}.{h + 1}: mean direct effect {mean[l, h]:+.3f}; mean weight from the end "
              f"on IO {io_w:.2f}, S1 {s1:.2f}, S2 {s2:.2f}; on IO above S (both) in {above:.0%} of prompts")


def _direction(model, io_id: int, s_id: int) -> torch.Tensor:
    """The unembedding's IO − S direction (the tied embedding's two rows)."""
    rows = model.word_vectors([[io_id, s_id]])[0]
    return rows[0] - rows[1]


if __name__ == "__main__":
    main()
