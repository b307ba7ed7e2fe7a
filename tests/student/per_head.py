"""Student modules that keep one projection per head, as the nanoGPT lecture's `Head` does:
a list of head modules, each with its own query, key and value, and three lists of Linears."""
import torch
import torch.nn as nn


class Head(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.query = nn.Linear(d_model, d_k, bias=False)
        self.key = nn.Linear(d_model, d_k, bias=False)
        self.value = nn.Linear(d_model, d_k, bias=False)

    def forward(self, x, mask=None):
        q, k, v = self.query(x), self.key(x), self.value(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        if mask is not None:
            wei = wei.masked_fill(mask == 0, float("-inf"))
        wei = torch.softmax(wei, dim=-1)
        return wei @ v, wei


class HeadList(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.heads = nn.ModuleList(Head(d_model, d_model // num_heads) for _ in range(num_heads))
        self.proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        outs, weights = zip(*(h(x, mask) for h in self.heads))
        return self.proj(torch.cat(outs, dim=-1)), torch.stack(weights, dim=1)


class LinearLists(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        d_k = d_model // num_heads
        self.q_heads = nn.ModuleList(nn.Linear(d_model, d_k) for _ in range(num_heads))
        self.k_heads = nn.ModuleList(nn.Linear(d_model, d_k) for _ in range(num_heads))
        self.v_heads = nn.ModuleList(nn.Linear(d_model, d_k) for _ in range(num_heads))
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        outs = []
        for wq, wk, wv in zip(self.q_heads, self.k_heads, self.v_heads):
            q, k, v = wq(x), wk(x), wv(x)
            scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            outs.append(torch.softmax(scores, dim=-1) @ v)
        return self.out(torch.cat(outs, dim=-1))
