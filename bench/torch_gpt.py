# SPDX-License-Identifier: Apache-2.0
"""The same GPT as pmt::nn::Gpt in PyTorch, for bench/train_step.py: pre-LN blocks, learned
positions, tanh-GELU MLP of width 4C, causal attention without a key bias, tied LM head,
AdamW(lr 3e-4, betas (0.9, 0.95), weight decay 0.1), clipping at 1.0, fp32.
Usage: torch_gpt.py LAYERS WIDTH HEADS CONTEXT BATCH VOCAB STEPS THREADS
Prints: torch_step ms=.. (median of STEPS steps after one warm-up)."""
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.q, self.k, self.v = nn.Linear(C, C), nn.Linear(C, C, bias=False), nn.Linear(C, C)
        self.proj = nn.Linear(C, C)
        self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        h = self.ln1(x)
        q, k, v = (f(h).view(B, T, self.H, C // self.H).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, L, C, H, T, V):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.T
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    L, C, H, T, B, V, steps, threads = (int(a) for a in sys.argv[1:9])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Gpt(L, C, H, T, V)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))

    def step():
        opt.zero_grad(set_to_none=False)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    print(f"torch_step ms={statistics.median(times) * 1e3:.3f} version={torch.__version__} threads={torch.get_num_threads()}")


if __name__ == "__main__":
    main()
