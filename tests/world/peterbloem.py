"""In the style of "Transformers from scratch" (Peter Bloem's blog and pbloem/former,
former/modules.py, MIT): tokeys, toqueries, tovalues and unifyheads defined in that order (their
names say which is which only to a reader), heads folded into the batch, queries and keys each
scaled by the fourth root of the head width."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, emb, heads=8):
        super().__init__()
        self.emb, self.heads = emb, heads
        self.tokeys = nn.Linear(emb, emb, bias=False)
        self.toqueries = nn.Linear(emb, emb, bias=False)
        self.tovalues = nn.Linear(emb, emb, bias=False)
        self.unifyheads = nn.Linear(emb, emb)

    def forward(self, x):
        b, t, e = x.size()
        h = self.heads
        s = e // h
        keys = self.tokeys(x).view(b, t, h, s)
        queries = self.toqueries(x).view(b, t, h, s)
        values = self.tovalues(x).view(b, t, h, s)
        keys = keys.transpose(1, 2).contiguous().view(b * h, t, s)
        queries = queries.transpose(1, 2).contiguous().view(b * h, t, s)
        values = values.transpose(1, 2).contiguous().view(b * h, t, s)
        queries = queries / (s ** (1 / 4))
        keys = keys / (s ** (1 / 4))
        dot = torch.bmm(queries, keys.transpose(1, 2))
        dot = F.softmax(dot, dim=2)
        out = torch.bmm(dot, values).view(b, h, t, s)
        out = out.transpose(1, 2).contiguous().view(b, t, s * h)
        return self.unifyheads(out)
