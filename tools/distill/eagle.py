"""A feature-conditioned draft (EAGLE style) for specd-distill.

The draft is one Llama decoder layer whose input is not a token alone but the token with the
target's own last hidden state at the position before it:

    u_t   = fc([rms(emb[x_t]) * w_tok ; rms(g_t) * w_feat])        fc: [D, 2D]
    h_t   = the decoder layer over u (causal attention over the draft's own keys)
    logits_{t+1} = head(rms(h_t) * output_norm)                        head: the N kept tokens

g_t is the target's last-layer output (before output_norm) at t-1 while that is known, and the
draft's own h_{t-1} for the tokens it drafts itself. The target's hidden state already holds its
whole context, so one layer is enough to step it one token on; a plain small draft has to
rebuild that context with a few layers of its own.

Training runs the draft the way it is used ("training-time test"): depth 0 sees true features at
every position; depth j >= 1 continues from depth j-1's output, its query at anchor a (position
a + j) attends to the depth-0 keys up to a plus its own chain's keys of depths 1..j. Every depth
is scored against the target's stored distribution, so the chain learns to feed itself.

Tensor shapes in comments: B rows, S positions (anchors), D model width, N head tokens.
"""
import math

import numpy as np

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def _rms(v, w, eps):
    import jax.numpy as jnp
    return v * (1.0 / jnp.sqrt(jnp.mean(v * v, axis=-1, keepdims=True) + eps)) * w


def _rope_tables(cfg, S, offset):
    import jax.numpy as jnp
    d = cfg["D"] // cfg["H"]
    inv_freq = 1.0 / (cfg["base"] ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = (jnp.arange(S, dtype=jnp.float32) + offset)[:, None] * inv_freq[None, :]  # [S, d/2]
    return jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]


def _rope(v, cos, sin):  # v: [B, S, h, d], pairs (2i, 2i+1) (the GGUF llama layout)
    import jax.numpy as jnp
    v0, v1 = v[..., 0::2], v[..., 1::2]
    return jnp.stack([v0 * cos - v1 * sin, v0 * sin + v1 * cos], axis=-1).reshape(v.shape)


def _ffn(W, x, eps):
    import jax
    h = _rms(x, W["ffn_norm"], eps)
    g = h @ W["ffn_gate"].T
    return x + (g * jax.nn.sigmoid(g) * (h @ W["ffn_up"].T)) @ W["ffn_down"].T


def _qkv(W, x, cfg, offset):
    B, S, _ = x.shape
    H, Hkv, d = cfg["H"], cfg["Hkv"], cfg["D"] // cfg["H"]
    h = _rms(x, W["attn_norm"], cfg["eps"])
    cos, sin = _rope_tables(cfg, S, offset)
    q = _rope((h @ W["attn_q"].T).reshape(B, S, H, d), cos, sin)
    k = _rope((h @ W["attn_k"].T).reshape(B, S, Hkv, d), cos, sin)
    v = (h @ W["attn_v"].T).reshape(B, S, Hkv, d)
    return q, k, v


def causal_layer(W, x, cfg):
    """One plain decoder layer. x: [B, S, D] -> [B, S, D] (also returns its K, V per KV head)."""
    import jax
    import jax.numpy as jnp
    B, S, D = x.shape
    H, Hkv, d = cfg["H"], cfg["Hkv"], D // cfg["H"]
    q, k, v = _qkv(W, x, cfg, 0)
    group = H // Hkv
    kr, vr = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)
    sc = jnp.einsum("bqhd,bkhd->bhqk", q, kr) / math.sqrt(d)
    sc = jnp.where(jnp.tril(jnp.ones((S, S), bool))[None, None], sc, -1e30)
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, axis=-1), vr).reshape(B, S, D)
    return _ffn(W, x + a @ W["attn_output"].T, cfg["eps"]), k, v


def chain_layer(W, x, cfg, depth, k0, v0, chain):
    """Depth `depth` >= 1 of the chain. x: [B, S, D], row a = anchor a's draft at position
    a + depth. k0, v0: [B, S, Hkv, d] the depth-0 keys; chain: [(k_i, v_i)] of depths 1..depth-1.
    Row a attends to k0[<= a] and to its own chain's keys (same a) of depths 1..depth."""
    import jax
    import jax.numpy as jnp
    B, S, D = x.shape
    H, Hkv, d = cfg["H"], cfg["Hkv"], D // cfg["H"]
    group = H // Hkv
    q, k, v = _qkv(W, x, cfg, depth)
    own = chain + [(k, v)]
    kr0, vr0 = jnp.repeat(k0, group, axis=2), jnp.repeat(v0, group, axis=2)
    sc0 = jnp.einsum("bqhd,bkhd->bhqk", q, kr0) / math.sqrt(d)  # [B, H, S, S]
    sc0 = jnp.where(jnp.tril(jnp.ones((S, S), bool))[None, None], sc0, -1e30)
    ks = jnp.stack([jnp.repeat(kk, group, axis=2) for kk, _ in own], axis=-1)  # [B,S,H,d,j]
    vs = jnp.stack([jnp.repeat(vv, group, axis=2) for _, vv in own], axis=-1)
    scd = jnp.einsum("bqhd,bqhdj->bhqj", q, ks) / math.sqrt(d)  # [B, H, S, j]
    p = jax.nn.softmax(jnp.concatenate([sc0, scd], axis=-1), axis=-1)
    a = (jnp.einsum("bhqk,bkhd->bqhd", p[..., :S], vr0)
         + jnp.einsum("bhqj,bqhdj->bqhd", p[..., S:], vs)).reshape(B, S, D)
    return _ffn(W, x + a @ W["attn_output"].T, cfg["eps"]), k, v


def target_hidden(layers, emb, tokens, cfg):
    """The target's last-layer output before output_norm. tokens: [B, S] -> [B, S, D]."""
    x = emb[tokens]
    for W in layers:
        x, _, _ = causal_layer(W, x, cfg)
    return x


def target_features(target, X, lengths, batch, log):
    """F: [N, S, D] float16, the target's last hidden state at every position of every row
    (the float forward of the target's own weights; rows cut to their length, rest zero)."""
    import jax
    import jax.numpy as jnp
    cfg = config_of(target)
    layers = [{k: jnp.asarray(target.w(f"blk.{l}.{k}.weight")) for k in LAYER_TENSORS}
              for l in range(target.L)]
    emb = jnp.asarray(target.w("token_embd.weight"))
    fwd = jax.jit(lambda t: target_hidden(layers, emb, t, cfg))
    N, S = X.shape
    F = np.zeros((N, S, cfg["D"]), np.float16)
    order = np.argsort(lengths, kind="stable")
    done = 0
    for i in range(0, N, batch):
        idx = order[i:i + batch]
        L = min(S, int(-(-lengths[idx].max() // 32) * 32))
        F[idx, :L] = np.asarray(fwd(jnp.asarray(X[idx, :L]))).astype(np.float16)
        done += int(lengths[idx].sum())
        if log:
            log(i + len(idx), N, done)
    return F


def config_of(target):
    return dict(D=target.D, H=target.H, Hkv=target.Hkv, eps=target.eps, base=target.base)


def init_params(target, head_ids, init_layer, seed):
    """The draft's start: the target's layer `init_layer`, its output norm and head rows, and a
    fc that passes the feature half through (the token half starts small)."""
    D = target.D
    rng = np.random.default_rng(seed)
    fc = np.concatenate([rng.normal(0, 0.02, (D, D)).astype(np.float32),
                         np.eye(D, dtype=np.float32)], axis=1)  # [D, 2D]
    emb = target.w("token_embd.weight")
    out = target.w("output.weight") if "output.weight" in target.t else emb
    # The feature enters normalized as the target's head reads it.
    params = dict(fc=fc, tok_norm=np.ones(D, np.float32),
                  feat_norm=target.w("output_norm.weight").copy(),
                  layer={k: target.w(f"blk.{init_layer}.{k}.weight") for k in LAYER_TENSORS},
                  output_norm=target.w("output_norm.weight"), output=out[head_ids].copy())
    return params, emb


def fuse_input(p, emb, tokens, feats, eps):
    """u = fc([rms(emb[tokens]) * tok_norm ; rms(feats) * feat_norm]). [B,S],[B,S,D] -> [B,S,D]."""
    import jax.numpy as jnp
    e = _rms(emb[tokens], p["tok_norm"], eps)
    g = _rms(feats, p["feat_norm"], eps)
    return jnp.concatenate([e, g], axis=-1) @ p["fc"].T


def head(p, h, eps):
    return _rms(h, p["output_norm"], eps) @ p["output"].T


def shift_left(a, j, fill=0):
    """a[:, t] <- a[:, t + j] (the last j positions get `fill`)."""
    import jax.numpy as jnp
    if j == 0:
        return a
    pad = jnp.full((a.shape[0], j) + a.shape[2:], fill, a.dtype)
    return jnp.concatenate([a[:, j:], pad], axis=1)


def chain_forward(p, emb, tokens, feats, cfg, depths, with_hidden=False):
    """Logits of every depth. tokens: [B, S]; feats: [B, S, D] the target's hidden state at each
    position (depth 0 at position t reads feats[t - 1]). Returns [depths] x [B, S, N]: depth j,
    anchor a = the draft's distribution for token a + j + 1 (and with_hidden, the draft's
    hidden states [depths] x [B, S, D]: depth j, anchor a = its guess of feats[a + j])."""
    import jax.numpy as jnp
    eps = cfg["eps"]
    prev = jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)
    x = fuse_input(p, emb, tokens, prev.astype(jnp.float32), eps)
    h, k0, v0 = causal_layer(p["layer"], x, cfg)
    out, hid = [head(p, h, eps)], [h]
    chain = []
    for j in range(1, depths):
        x = fuse_input(p, emb, shift_left(tokens, j), h, eps)
        h, k, v = chain_layer(p["layer"], x, cfg, j, k0, v0, chain)
        chain.append((k, v))
        out.append(head(p, h, eps))
        hid.append(h)
    return (out, hid) if with_hidden else out


def chain_loss(p, emb, tokens, feats, slots, probs, weight, cfg, depths, kl, mask=None,
               feature_weight=0.0):
    """Mean over depths of the KL at each depth (slots/probs/weight: [B, S, ...] at index t the
    target's distribution for token t + 1, specd_distill.make_batches), plus feature_weight x
    the mean absolute error between the draft's hidden state and the target's, both as the head
    sees them (rms-normed, times output_norm), over every real position (mask: [B, S], prompt
    positions included): a dense signal where the KL only has the response's top-N."""
    import jax.numpy as jnp
    outs, hids = chain_forward(p, emb, tokens, feats, cfg, depths, with_hidden=True)
    eps = cfg["eps"]
    total = 0.0
    for j, lg in enumerate(outs):
        total = total + kl(lg, shift_left(slots, j, -1), shift_left(probs, j, 0.0),
                           shift_left(weight, j, 0.0))
        if feature_weight > 0:
            want = _rms(shift_left(feats, j).astype(jnp.float32), p["output_norm"], eps)
            got = _rms(hids[j], p["output_norm"], eps)
            m = shift_left(mask, j, 0.0)[..., None]
            err = (jnp.abs(got - jnp.asarray(want)) * m).sum() / jnp.maximum(m.sum() * want.shape[-1], 1.0)
            total = total + feature_weight * err
    return total / depths


def evaluate(p, emb, cfg, X, F, S, P, W, temps, batch, depths):
    """Held-out acceptance of the chain as speculation sees it.

    Greedy rows: at every anchor whose next `depths` tokens are response tokens, the chain drafts
    `depths` tokens (each depth fed the true previous token, as it is when the earlier drafts
    were accepted); run = how many leading drafts equal the target's argmax. Per-position
    acceptance j = P(draft j right | drafts < j right); accepted length = mean(run) + 1.
    Sampled rows: depth 0's sum min(p, q) over the stored top-N (a lower bound of 1 - TV)."""
    import jax
    import jax.numpy as jnp
    fwd = jax.jit(lambda pp, t, f: chain_forward(pp, emb, t, f, cfg, depths))
    runs = []
    s_acc = s_n = 0.0
    for i in range(0, len(X), batch):
        sl = slice(i, i + batch)
        outs = [np.asarray(o) for o in fwd(p, jnp.asarray(X[sl]), jnp.asarray(F[sl]))]
        for b in range(outs[0].shape[0]):
            w = W[i + b] > 0
            if not w.any():
                continue
            if temps[i + b] == 0:
                top = S[i + b][:, 0]  # the target's argmax at each index
                Sn = len(top)
                hits = np.zeros((depths, Sn), bool)
                for j in range(depths):
                    am = outs[j][b].argmax(-1)  # [S]
                    idx = np.arange(Sn) + j
                    ok = idx < Sn
                    hits[j, ok] = (am[ok] == top[idx[ok]]) & (top[idx[ok]] >= 0)
                valid = np.array([w[a:a + depths].all() and a + depths <= Sn for a in range(Sn)])
                for a in np.nonzero(valid)[0]:
                    r = 0
                    while r < depths and hits[r, a]:
                        r += 1
                    runs.append(r)
            else:
                lg = outs[0][b][w]
                q = np.exp(lg - lg.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
                slots, probs = S[i + b][w], P[i + b][w]
                qs = np.where(slots >= 0, np.take_along_axis(q, np.maximum(slots, 0), -1), 0)
                s_acc += float(np.minimum(probs, qs).sum()); s_n += len(slots)
    runs = np.asarray(runs)
    per_pos = [float((runs > j).sum() / max((runs >= j).sum(), 1)) for j in range(depths)]
    return dict(greedy_acceptance=per_pos[0], greedy_per_position=per_pos,
                greedy_accepted_length=float(runs.mean() + 1) if len(runs) else 1.0,
                greedy_anchors=int(len(runs)),
                sampled_acceptance=s_acc / max(s_n, 1), sampled_positions=int(s_n))


def rows_forward(p, emb, tokens, row_feats, cfg):
    """The engine's view: row t is fed row_feats[t] as it stands (ForwardBatch::input_features).
    tokens: [B, S], row_feats: [B, S, D] -> (head logits [B, S, N], hidden [B, S, D])."""
    x = fuse_input(p, emb, tokens, row_feats, cfg["eps"])
    h, _, _ = causal_layer(p["layer"], x, cfg)
    return head(p, h, cfg["eps"]), h


def as_export(p):
    """The draft's parameters in specd_distill.export_gguf's layout."""
    return {"layers": [p["layer"]], "output_norm": p["output_norm"], "output": p["output"],
            "eagle": {"fc": p["fc"], "tok_norm": p["tok_norm"], "feat_norm": p["feat_norm"]}}


def from_export(params):
    """export_gguf's layout (load_exported) back to the draft's parameters."""
    e = params["eagle"]
    return dict(fc=e["fc"], tok_norm=e["tok_norm"], feat_norm=e["feat_norm"],
                layer=params["layers"][0], output_norm=params["output_norm"],
                output=params["output"])
