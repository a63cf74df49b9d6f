"""A GPT-style decoder-only language model in plain PyTorch: byte-level (a vocabulary of 256), pre-LayerNorm blocks
of causal self-attention and a 4x MLP, learned positions, the output head tied to the token embedding. Nothing is
downloaded: the weights start from a seed.

    model = GPT(layers=4, width=256, heads=4, context=128)   # 3,257,856 parameters (count(model))
    logits = model(tokens)                                   # tokens: (batch, time) int64 in 0..255
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256  # bytes


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, layers=4, width=256, heads=4, context=128, seed=1):
        super().__init__()
        if width % heads:
            raise ValueError(f"gpt: width {width} does not split into {heads} heads")
        self.context = context
        torch.manual_seed(seed)
        self.tokens = nn.Embedding(VOCAB, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.tokens.weight  # tied: one matrix reads and writes bytes
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                # GPT-2's scale: the projections that add into the residual stream shrink with the depth
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"gpt: a sequence of {t} tokens is longer than the context of {self.context}")
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))

    @torch.no_grad()
    def generate(self, prompt, count, temperature=0.8, seed=0):
        """`count` bytes after `prompt` (bytes), sampled with a fixed seed: the same model writes the same text."""
        g = torch.Generator().manual_seed(seed)
        idx = torch.tensor([list(prompt)], dtype=torch.long)
        for _ in range(count):
            logits = self(idx[:, -self.context:])[0, -1] / temperature
            nxt = torch.multinomial(torch.softmax(logits, dim=0), 1, generator=g)
            idx = torch.cat([idx, nxt.view(1, 1)], dim=1)
        return bytes(idx[0].tolist())


def count(model):
    """Parameters, each tied matrix once."""
    return sum(p.numel() for p in model.parameters())


def parameter_groups(model, weight_decay):
    """AdamW's two groups: decay on the matrices (the embeddings too), none on the biases and LayerNorms."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
