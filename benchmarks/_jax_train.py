"""The JAX peer of ``bench_train.py``: GPT ``small`` (vocab 2048, d 256, 8 layers, 8 heads, seq 128,
pre-norm LayerNorm, GELU MLP of 4·d, untied head), a batch of 8 × 128, AdamW, float32, on 8 virtual
CPU devices (run with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``), ``jit`` with
``NamedSharding`` over a (dp=4, tp=2) mesh: Megatron's split (QKV and MLP-in by columns, the
output projections by rows) over tp, the batch over dp.  JAX has no pipeline axis; pp's devices
are data parallel here.  Prints one JSON line: the median seconds of 3 steps after compilation."""

from __future__ import annotations

import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

V, D, L, H, S, B = 2048, 256, 8, 8, 128, 8


def init(key):
    ks = iter(jax.random.split(key, 4 + 4 * L))
    n = lambda shape, scale=0.02: scale * jax.random.normal(next(ks), shape, jnp.float32)  # noqa: E731
    blocks = [{"ln1": jnp.ones(D), "ln1b": jnp.zeros(D), "qkv": n((D, 3 * D)), "qkvb": jnp.zeros(3 * D),
               "out": n((D, D)), "outb": jnp.zeros(D), "ln2": jnp.ones(D), "ln2b": jnp.zeros(D),
               "up": n((D, 4 * D)), "upb": jnp.zeros(4 * D), "down": n((4 * D, D)), "downb": jnp.zeros(D)}
              for _ in range(L)]
    return {"tok": n((V, D)), "pos": n((S, D)), "blocks": blocks, "lnf": jnp.ones(D), "lnfb": jnp.zeros(D),
            "head": n((D, V))}


def spec(path: str) -> P:
    leaf = path.split("/")[-1]
    return {"qkv": P(None, "tp"), "qkvb": P("tp"), "up": P(None, "tp"), "upb": P("tp"), "out": P("tp", None),
            "down": P("tp", None), "head": P(None, "tp")}.get(leaf, P())


def norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * g + b


def loss_fn(params, tokens, targets):
    x = params["tok"][tokens] + params["pos"][None, :S]
    mask = jnp.tril(jnp.ones((S, S), bool))
    for blk in params["blocks"]:
        h = norm(x, blk["ln1"], blk["ln1b"]) @ blk["qkv"] + blk["qkvb"]
        q, k, v = jnp.split(h.reshape(B, S, 3, H, D // H), 3, axis=2)
        q, k, v = (t[:, :, 0].transpose(0, 2, 1, 3) for t in (q, k, v))
        att = jnp.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // H), -1e30)
        y = (jax.nn.softmax(att, -1) @ v).transpose(0, 2, 1, 3).reshape(B, S, D)
        x = x + y @ blk["out"] + blk["outb"]
        h = jax.nn.gelu(norm(x, blk["ln2"], blk["ln2b"]) @ blk["up"] + blk["upb"], approximate=True)
        x = x + h @ blk["down"] + blk["downb"]
    logits = norm(x, params["lnf"], params["lnfb"]) @ params["head"]
    logp = jax.nn.log_softmax(logits, -1)
    return -jnp.take_along_axis(logp, targets[..., None], -1).mean()


def adamw(params, grads, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    m = jax.tree.map(lambda a, g: b1 * a + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda a, g: b2 * a + (1 - b2) * g * g, v, grads)
    fix1, fix2 = 1 - b1 ** t, 1 - b2 ** t
    params = jax.tree.map(lambda p, a, b: p - lr * (a / fix1 / (jnp.sqrt(b / fix2) + eps) + wd * p),
                          params, m, v)
    return params, m, v


def main() -> None:
    devices = np.array(jax.devices()[:8]).reshape(4, 2)
    mesh = Mesh(devices, ("dp", "tp"))
    params = init(jax.random.PRNGKey(0))
    shard = jax.tree_util.tree_map_with_path(
        lambda path, _: NamedSharding(mesh, spec("/".join(str(getattr(k, "key", k)) for k in path))), params)
    params = jax.device_put(params, shard)
    m = jax.device_put(jax.tree.map(jnp.zeros_like, params), shard)
    v = jax.device_put(jax.tree.map(jnp.zeros_like, params), shard)
    data = NamedSharding(mesh, P("dp", None))
    rng = np.random.default_rng(0)
    start = rng.integers(0, 16, (B, 1))
    ids = (start + np.arange(S + 1)[None, :]) % 16
    tokens, targets = jax.device_put(ids[:, :-1], data), jax.device_put(ids[:, 1:], data)

    @jax.jit
    def step(params, m, v, t, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        params, m, v = adamw(params, grads, m, v, t)
        return params, m, v, loss

    params, m, v, loss = step(params, m, v, 1.0, tokens, targets)  # compiles
    loss.block_until_ready()
    times = []
    for t in range(2, 5):
        t0 = time.perf_counter()
        params, m, v, loss = step(params, m, v, float(t), tokens, targets)
        loss.block_until_ready()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_s": statistics.median(times), "loss": float(loss)}))


if __name__ == "__main__":
    main()
