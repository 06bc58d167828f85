"""specd-distill: train a small draft model that imitates the target's next-token distribution.

Pipeline (`specd-distill run`, each step also a subcommand):
  1. prompts   the project's prompt sets (tools/distill/prompts.py, passages.py): train + held-out
               eval
  2. data      `specd distill-data`: the serving engine generates responses (greedy and sampled)
               and records the target's top-N log-probs at every response position
  3. train     a Llama-architecture draft in JAX + optax: the target's first L layers as the
               start, its token embeddings shared (frozen, borrowed at load, not in the file), an
               output head over the N most frequent target tokens; loss = forward KL from the
               target's sparse distribution (top-N + the rest as one bucket), optionally plus
               the total variation over the same buckets (--loss kl+tv, --tv-weight)
  4. export    GGUF: layers + head quantized (gguf-py), `output_token_ids` (I32), the target's
               tokenizer metadata (the vocabulary fingerprint matches)
  5. report    loss curve PNG, held-out acceptance (greedy: argmax agreement; sampled:
               1 - total variation, over the stored top-N), report.json

`train --kind eagle` trains a feature-conditioned draft instead (tools/distill/eagle.py): one
layer over (token, the target's final hidden state), the states computed by the serving engine
(`specd hidden`), the loss taken at every depth of the draft's own chain (plus a regression of
its hidden state onto the target's, --feature-weight); held-out acceptance per draft position.

Why JAX: PyPI's jax + optax install CPU-only in ~100 MB; torch for Linux pulls several GB of
CUDA libraries, and the trainer has to run on the 2-core development machine and in CI.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prompts as prompt_sets  # noqa: E402

LAYER_TENSORS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


def die(msg):
    print(f"specd-distill: error: {msg}", file=sys.stderr)
    sys.exit(2)


# ---------------------------------------------------------------------------------------------
# The target (and any GGUF) as float32 numpy arrays.

class Gguf:
    def __init__(self, path):
        import gguf
        if not os.path.isfile(path):
            die(f"--target {path}: no such file")
        try:
            self.r = gguf.GGUFReader(path)
        except Exception as e:  # the reader raises plain exceptions on corrupt files
            die(f"--target {path}: not a readable GGUF file ({e})")
        self.path = path
        self.t = {t.name: t for t in self.r.tensors}
        a = self.arch = self.field("general.architecture")
        if a != "llama":
            die(f"--target {path}: architecture {a!r}; specd-distill drafts llama targets")
        self.D = int(self.field(a + ".embedding_length"))
        self.L = int(self.field(a + ".block_count"))
        self.H = int(self.field(a + ".attention.head_count"))
        self.Hkv = int(self.field(a + ".attention.head_count_kv"))
        self.F = int(self.field(a + ".feed_forward_length"))
        self.eps = float(self.field(a + ".attention.layer_norm_rms_epsilon"))
        self.base = float(self.field(a + ".rope.freq_base", 10000.0))
        self.vocab = len(self.field("tokenizer.ggml.tokens"))
        self.ctx = int(self.field(a + ".context_length", 2048))

    def field(self, key, default=None):
        f = self.r.fields.get(key)
        if f is None:
            if default is None:
                die(f"{self.path}: missing metadata {key}")
            return default
        return f.contents()

    def w(self, name):
        from gguf import quants
        t = self.t[name]
        return np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# Data written by `specd distill-data` (format in tools/distill_data.h).

def read_data(path):
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != b"SPDDATA1":
        die(f"{path}: not a specd distill-data file")
    version, top_n, vocab, n = struct.unpack_from("<IIII", buf, 8)
    (fingerprint,) = struct.unpack_from("<Q", buf, 24)
    off = 32
    recs = []
    for _ in range(n):
        if off + 16 > len(buf):
            break  # a file still being written (or cut short): use the complete records
        npr, nre, temp, pidx = struct.unpack_from("<IIfI", buf, off)
        if off + 16 + 4 * (npr + nre) + 8 * nre * top_n > len(buf):
            break
        off += 16
        toks = np.frombuffer(buf, np.int32, npr + nre, off); off += 4 * (npr + nre)
        ids = np.frombuffer(buf, np.int32, nre * top_n, off).reshape(nre, top_n); off += 4 * nre * top_n
        lps = np.frombuffer(buf, np.float32, nre * top_n, off).reshape(nre, top_n); off += 4 * nre * top_n
        recs.append(dict(num_prompt=npr, tokens=toks, top_ids=ids, top_lp=lps, temperature=temp,
                         prompt_index=pidx))
    return dict(top_n=top_n, vocab=vocab, fingerprint=fingerprint, records=recs)


def read_hidden(path, shape, dim):
    """`specd hidden` output as [rows, seq_len, dim] float16 (zeros past each row's length)."""
    buf = np.memmap(path, np.uint8, mode="r")
    if bytes(buf[:8]) != b"SPDHID01":
        die(f"{path}: not a specd hidden file")
    fdim, n = struct.unpack_from("<II", buf, 8)
    if fdim != dim or n != shape[0]:
        die(f"{path}: {n} records of width {fdim}, expected {shape[0]} of {dim}")
    F = np.zeros(shape + (dim,), np.float16)
    off = 16
    for r in range(n):
        (L,) = struct.unpack_from("<I", buf, off); off += 4
        F[r, :L] = np.frombuffer(buf, np.float16, L * dim, off).reshape(L, dim)
        off += 2 * L * dim
    return F


def choose_head_vocab(data, n, vocab, always=()):
    """The n tokens with the most target probability mass over the data (plus `always`)."""
    mass = np.zeros(vocab, np.float64)
    for r in data["records"]:
        np.add.at(mass, r["top_ids"].ravel(), np.exp(r["top_lp"].ravel().astype(np.float64)))
        np.add.at(mass, r["tokens"], 1e-3)  # every token seen in prompts or responses
    for t in always:
        mass[t] += 1e9
    n = min(n, vocab)
    ids = np.sort(np.argsort(-mass, kind="stable")[:n]).astype(np.int32)
    return ids


def make_batches(data, head_ids, seq_len, vocab):
    """Fixed-length training rows: tokens, and per position the sparse target over head slots.

    For position t (predicting token t+1) of a response: tgt_slot [top_n] (head index or -1),
    tgt_p [top_n]; rows with no target have weight 0.
    """
    slot_of = np.full(vocab, -1, np.int32)
    slot_of[head_ids] = np.arange(len(head_ids), dtype=np.int32)
    top_n = data["top_n"]
    rows = []
    for r in data["records"]:
        toks = r["tokens"]
        npr = r["num_prompt"]
        nre = len(toks) - npr
        L = min(len(toks), seq_len)
        x = np.zeros(seq_len, np.int32); x[:L] = toks[:L]
        slots = np.full((seq_len, top_n), -1, np.int32)
        probs = np.zeros((seq_len, top_n), np.float32)
        weight = np.zeros(seq_len, np.float32)
        for j in range(nre):
            t = npr - 1 + j  # position whose output predicts response token j
            if t >= L:
                break
            slots[t] = slot_of[r["top_ids"][j]]
            probs[t] = np.exp(r["top_lp"][j])
            weight[t] = 1.0
        rows.append((x, slots, probs, weight))
    X = np.stack([a[0] for a in rows]); S = np.stack([a[1] for a in rows])
    P = np.stack([a[2] for a in rows]); W = np.stack([a[3] for a in rows])
    return X, S, P, W


# ---------------------------------------------------------------------------------------------
# The model: the engine's Llama forward (scripts/gen_model_goldens.py is its numpy twin).

def init_params(target, layers, head_ids):
    params = {"layers": [], "output_norm": target.w("output_norm.weight")}
    for l in layers:
        p = f"blk.{l}."
        params["layers"].append({k: target.w(p + k + ".weight") for k in LAYER_TENSORS})
    emb = target.w("token_embd.weight")
    out = target.w("output.weight") if "output.weight" in target.t else emb
    params["output"] = out[head_ids].copy()
    return params, emb


def forward(params, emb, tokens, cfg):
    """tokens: [B, S] -> head logits [B, S, N]."""
    import jax.numpy as jnp
    B, S = tokens.shape
    D, H, Hkv = cfg["D"], cfg["H"], cfg["Hkv"]
    d = D // H
    eps = cfg["eps"]
    x = emb[tokens]  # [B, S, D]
    inv_freq = 1.0 / (cfg["base"] ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = jnp.arange(S, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # [S, d/2]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]

    def rms(v, w):
        return v * jnp.reciprocal(jnp.sqrt(jnp.mean(v * v, axis=-1, keepdims=True) + eps)) * w

    def rope(v):  # v: [B, S, h, d], pairs (2i, 2i+1) (the GGUF llama layout)
        v0, v1 = v[..., 0::2], v[..., 1::2]
        r0 = v0 * cos - v1 * sin
        r1 = v0 * sin + v1 * cos
        return jnp.stack([r0, r1], axis=-1).reshape(v.shape)

    mask = jnp.tril(jnp.ones((S, S), bool))
    group = H // Hkv
    for W in params["layers"]:
        h = rms(x, W["attn_norm"])
        q = (h @ W["attn_q"].T).reshape(B, S, H, d)
        k = (h @ W["attn_k"].T).reshape(B, S, Hkv, d)
        v = (h @ W["attn_v"].T).reshape(B, S, Hkv, d)
        q, k = rope(q), rope(k)
        k = jnp.repeat(k, group, axis=2)
        v = jnp.repeat(v, group, axis=2)
        sc = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
        sc = jnp.where(mask[None, None], sc, -1e30)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax_softmax(sc), v).reshape(B, S, H * d)
        x = x + a @ W["attn_output"].T
        h = rms(x, W["ffn_norm"])
        g = h @ W["ffn_gate"].T
        u = h @ W["ffn_up"].T
        x = x + (g * jax_sigmoid(g) * u) @ W["ffn_down"].T
    return rms(x, params["output_norm"]) @ params["output"].T


def forward_config(target):
    """What `forward` needs of the target besides weights: width, heads, norm eps, rope base."""
    return dict(D=target.D, H=target.H, Hkv=target.Hkv, eps=target.eps, base=target.base)


def jax_softmax(x):
    import jax
    return jax.nn.softmax(x, axis=-1)


def jax_sigmoid(x):
    import jax
    return jax.nn.sigmoid(x)


def bucketed(logits, slots, probs):
    """The two distributions the losses compare, over the same buckets: the target's top-N
    (slots into the head; -1 = not in the head) plus one bucket for the rest of the mass on
    both sides. Returns (valid, p_in, log q_in, q_in, p_rest, q_rest), rests unclipped."""
    import jax
    import jax.numpy as jnp
    logq = jax.nn.log_softmax(logits, axis=-1)  # [B, S, N]
    valid = slots >= 0
    lq_top = jnp.take_along_axis(logq, jnp.maximum(slots, 0), axis=-1)  # [B, S, top]
    p_in = jnp.where(valid, probs, 0.0)
    q_in = jnp.where(valid, jnp.exp(lq_top), 0.0)
    return valid, p_in, lq_top, q_in, 1.0 - p_in.sum(-1), 1.0 - q_in.sum(-1)


def weighted_mean(per_row, weight):
    import jax.numpy as jnp
    return (per_row * weight).sum() / jnp.maximum(weight.sum(), 1.0)


def kl_loss(logits, slots, probs, weight):
    """Forward KL(p || q) over the buckets (`bucketed`). Returns the mean over weighted rows."""
    import jax.numpy as jnp
    valid, p_in, lq_top, _, p_rest, q_rest = bucketed(logits, slots, probs)
    p_rest = jnp.clip(p_rest, 1e-6, 1.0)
    q_rest = jnp.clip(q_rest, 1e-6, 1.0)
    kl = (jnp.where(valid, p_in * (jnp.log(jnp.maximum(p_in, 1e-12)) - lq_top), 0.0).sum(-1)
          + p_rest * (jnp.log(p_rest) - jnp.log(q_rest)))
    return weighted_mean(kl, weight)


def tv_loss(logits, slots, probs, weight):
    """Total variation between the target's and the draft's next-token distributions over the
    same buckets as kl_loss: half the summed |p - q|. 1 - TV is the acceptance of a sampled
    draft token, so this is the divergence sampled speculation pays for. Returns the mean over
    weighted rows."""
    import jax.numpy as jnp
    _, p_in, _, q_in, p_rest, q_rest = bucketed(logits, slots, probs)
    p_rest = jnp.clip(p_rest, 0.0, 1.0)
    q_rest = jnp.clip(q_rest, 0.0, 1.0)
    return weighted_mean(0.5 * (jnp.abs(p_in - q_in).sum(-1) + jnp.abs(p_rest - q_rest)), weight)


def distill_loss(args):
    """--loss: the divergence a step minimises, as f(logits, slots, probs, weight)."""
    if args.loss == "kl":
        return kl_loss
    if args.loss == "tv":
        return tv_loss
    w = args.tv_weight
    return lambda *a: kl_loss(*a) + w * tv_loss(*a)


# ---------------------------------------------------------------------------------------------
# Held-out acceptance: what speculation would see with this draft.

def evaluate(params, emb, cfg, X, S, P, W, temps, batch):
    """Per-token acceptance on held-out rows: greedy rows = argmax agreement with the target;
    sampled rows = sum_x min(p, q) over the stored top-N (a lower bound of 1 - TV)."""
    import jax
    import jax.numpy as jnp
    fwd = jax.jit(lambda p, t: forward(p, emb, t, cfg))
    g_hit = g_n = s_acc = s_n = 0.0
    for i in range(0, len(X), batch):
        lg = np.asarray(fwd(params, jnp.asarray(X[i:i + batch])))
        q = np.exp(lg - lg.max(-1, keepdims=True)); q /= q.sum(-1, keepdims=True)
        for b in range(lg.shape[0]):
            w = W[i + b] > 0
            if not w.any():
                continue
            slots, probs = S[i + b][w], P[i + b][w]
            qb = q[b][w]
            if temps[i + b] == 0:
                top = slots[:, 0]  # the target's argmax (the greedy token)
                g_hit += float(((top >= 0) & (qb.argmax(-1) == top)).sum()); g_n += len(top)
            else:
                qs = np.where(slots >= 0, np.take_along_axis(qb, np.maximum(slots, 0), -1), 0)
                s_acc += float(np.minimum(probs, qs).sum()); s_n += len(slots)
    return dict(greedy_acceptance=g_hit / max(g_n, 1), greedy_positions=int(g_n),
                sampled_acceptance=s_acc / max(s_n, 1), sampled_positions=int(s_n))


# ---------------------------------------------------------------------------------------------
# Export.

EXPORT_TYPES = ("q4_1", "q8_0", "f16", "f32")  # --layer-type / --head-type


def export_gguf(target, params, head_ids, path, layer_type, head_type, extra):
    """Writes the draft GGUF; layer_type and head_type are names from EXPORT_TYPES."""
    import gguf
    from gguf import GGMLQuantizationType as Q, quants
    types = {"q4_1": Q.Q4_1, "q8_0": Q.Q8_0, "f16": Q.F16, "f32": Q.F32}
    layer_type, head_type = types[layer_type], types[head_type]
    a = "llama"
    w = gguf.GGUFWriter(path, a)
    L = len(params["layers"])
    w.add_name(f"specd distilled draft of {target.field('general.name', 'target')}")
    w.add_context_length(target.ctx)
    w.add_embedding_length(target.D)
    w.add_block_count(L)
    w.add_feed_forward_length(target.F)
    w.add_head_count(target.H)
    w.add_head_count_kv(target.Hkv)
    w.add_rope_freq_base(target.base)
    w.add_layer_norm_rms_eps(target.eps)
    w.add_vocab_size(target.vocab)
    w.add_rope_dimension_count(target.D // target.H)
    for key, field in target.r.fields.items():  # the tokenizer, so the fingerprint matches
        if key.startswith("tokenizer."):
            val = field.contents()
            vtype = field.types[0]
            if vtype == gguf.GGUFValueType.ARRAY:
                w.add_key_value(key, val, vtype, sub_type=field.types[-1])
            else:
                w.add_key_value(key, val, vtype)
    w.add_string("specd.draft.target", os.path.basename(target.path))
    w.add_string("specd.draft.borrows", "token_embd.weight")
    w.add_string("specd.draft.recipe", json.dumps(extra, sort_keys=True))

    def q(name, arr, ty):
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if ty == Q.F32:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, quants.quantize(arr, ty), raw_dtype=ty)

    for i, W in enumerate(params["layers"]):
        for k in LAYER_TENSORS:
            arr = np.asarray(W[k])
            q(f"blk.{i}.{k}.weight", arr, Q.F32 if arr.ndim == 1 else layer_type)
    if "eagle" in params:  # a feature-conditioned draft (tools/distill/eagle.py)
        E = params["eagle"]
        w.add_string("specd.draft.kind", "eagle")
        q("eagle.tok_norm.weight", np.asarray(E["tok_norm"]), Q.F32)
        q("eagle.feat_norm.weight", np.asarray(E["feat_norm"]), Q.F32)
        q("eagle.fc.weight", np.asarray(E["fc"]), layer_type)
    q("output_norm.weight", np.asarray(params["output_norm"]), Q.F32)
    q("output.weight", np.asarray(params["output"]), head_type)
    w.add_tensor("output_token_ids", np.asarray(head_ids, np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_exported(path, target):
    """The exported draft's weights, dequantized: what the engine will run."""
    d = Gguf(path)
    params = {"layers": [{k: d.w(f"blk.{i}.{k}.weight") for k in LAYER_TENSORS}
                         for i in range(d.L)],
              "output_norm": d.w("output_norm.weight"), "output": d.w("output.weight")}
    if "eagle.fc.weight" in d.t:
        params["eagle"] = {"fc": d.w("eagle.fc.weight"), "tok_norm": d.w("eagle.tok_norm.weight"),
                           "feat_norm": d.w("eagle.feat_norm.weight")}
    ids = np.asarray(d.t["output_token_ids"].data, np.int32)
    return params, ids


# ---------------------------------------------------------------------------------------------
# Commands.

def cmd_prompts(args):
    os.makedirs(args.out_dir, exist_ok=True)
    tr, ev = prompt_sets.build_sets(args.num_train, args.num_eval, seed=args.prompt_seed,
                                    num_passage=args.num_passage)
    prompt_sets.write_jsonl(os.path.join(args.out_dir, "train.jsonl"), tr)
    prompt_sets.write_jsonl(os.path.join(args.out_dir, "eval.jsonl"), ev)
    print(f"specd-distill: {len(tr)} training and {len(ev)} held-out prompts in {args.out_dir}",
          file=sys.stderr)


def run_data(args, prompts_file, out, seed, temperature_mode="each"):
    cmd = [args.specd, "distill-data", "-m", args.target, "--prompts", prompts_file, "-o", out,
           "-n", str(args.max_new_tokens), "--temperatures", args.temperatures,
           "--temperature-mode", temperature_mode, "--seed", str(seed),
           "--batch", str(args.gen_batch)]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    print("specd-distill: " + " ".join(cmd), file=sys.stderr)
    rc = subprocess.call(cmd)
    if rc != 0:
        die(f"specd distill-data failed (exit {rc})")


def cmd_data(args):
    check_target(args)
    d = args.out_dir
    os.makedirs(d, exist_ok=True)
    # The held-out set always answers every prompt at every temperature, so its figures stay
    # comparable whatever the training draw does.
    run_data(args, os.path.join(d, "eval.jsonl"), os.path.join(d, "eval.bin"), args.seed + 1)
    run_data(args, os.path.join(d, "train.jsonl"), os.path.join(d, "train.bin"), args.seed,
             args.train_temperature_mode)


def check_target(args):
    if not args.target or not os.path.isfile(args.target):
        die(f"--target {args.target!r}: no such file")


def read_training_sets(args, target):
    """The data both draft kinds train on: OUT_DIR/train.bin and eval.bin as fixed-length rows
    (make_batches) over the head's tokens (the --head-vocab with the most target mass, EOS
    always), the held-out rows' temperatures and the training rows' lengths."""
    import types
    d = args.out_dir
    train = read_data(os.path.join(d, "train.bin"))
    evald = read_data(os.path.join(d, "eval.bin"))
    if not train["records"]:
        die(f"{d}/train.bin holds no records")
    eos = [int(target.field("tokenizer.ggml.eos_token_id", 2))]
    head_ids = choose_head_vocab(train, args.head_vocab, target.vocab, always=eos)
    X, S, P, W = make_batches(train, head_ids, args.seq_len, target.vocab)
    EX, ES, EP, EW = make_batches(evald, head_ids, args.seq_len, target.vocab)
    return types.SimpleNamespace(
        train=train, head_ids=head_ids, X=X, S=S, P=P, W=W, EX=EX, ES=ES, EP=EP, EW=EW,
        etemps=[r["temperature"] for r in evald["records"]],
        lengths=np.asarray([min(len(r["tokens"]), args.seq_len) for r in train["records"]]))


def make_optimizer(args):
    """AdamW with a short warm-up and a cosine decay to 5 % of --lr, gradients clipped at 1."""
    import optax
    warmup = max(1, min(50, args.steps // 10))
    sched = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, max(args.steps, warmup + 1),
                                               args.lr * 0.05)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(sched, weight_decay=0.0))


def run_steps(args, step, params, state, lengths, batch_of):
    """--steps optimizer steps over batches of rows of similar length (cut to their longest row
    rounded up to 32: most rows are far shorter than --seq-len, and padding is most of the work
    otherwise; one compile per shape), in a random order, with progress lines. batch_of(idx) ->
    (the step's arguments after params and state, target positions in them). Returns (params,
    loss curve, seconds)."""
    rng = np.random.default_rng(args.seed)
    by_len = np.argsort(lengths, kind="stable")
    buckets = [by_len[i:i + args.batch] for i in range(0, len(by_len), args.batch)]
    buckets = [b for b in buckets if len(b) == args.batch] or buckets
    curve = []
    t0 = time.time()
    tokens_done = 0
    order = rng.permutation(len(buckets))
    pos = 0
    for it in range(1, args.steps + 1):
        if pos >= len(order):
            order = rng.permutation(len(buckets)); pos = 0
        batch, positions = batch_of(buckets[order[pos]]); pos += 1
        params, state, loss = step(params, state, *batch)
        tokens_done += positions
        if it % args.log_every == 0 or it == 1 or it == args.steps:
            loss = float(loss)
            curve.append((it, loss))
            el = time.time() - t0
            print(f"specd-distill: step {it}/{args.steps} loss {loss:.4f} "
                  f"{tokens_done / el:.0f} target tok/s, {el:.0f} s, "
                  f"ETA {el / it * (args.steps - it):.0f} s", file=sys.stderr, flush=True)
    return params, curve, time.time() - t0


def cmd_train(args):
    import jax
    import jax.numpy as jnp
    import optax
    check_target(args)
    if args.layers < 1 or args.head_vocab < 2 or args.steps < 1 or args.batch < 1 \
            or args.seq_len < 8 or not (args.lr > 0) or not (args.tv_weight >= 0):
        die("--layers, --head-vocab, --steps, --batch, --seq-len and --lr must be positive "
            "and --tv-weight not negative "
            f"(got layers={args.layers} head_vocab={args.head_vocab} steps={args.steps} "
            f"batch={args.batch} seq_len={args.seq_len} lr={args.lr} "
            f"tv_weight={args.tv_weight})")
    target = Gguf(args.target)
    if args.layers >= target.L:
        die(f"--layers {args.layers}: the draft must have fewer layers than the target's {target.L}")
    d = args.out_dir
    sets = read_training_sets(args, target)
    train, head_ids = sets.train, sets.head_ids
    X, S, P, W, EX, ES, EP, EW = sets.X, sets.S, sets.P, sets.W, sets.EX, sets.ES, sets.EP, sets.EW
    etemps, lengths = sets.etemps, sets.lengths
    cfg = forward_config(target)
    src_layers = [int(x) for x in args.init_layers.split(",")] if args.init_layers else \
        list(range(args.layers))
    if len(src_layers) != args.layers or any(l < 0 or l >= target.L for l in src_layers):
        die(f"--init-layers {args.init_layers!r}: need {args.layers} layer indices in [0, {target.L})")
    params, emb = init_params(target, src_layers, head_ids)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    emb = jnp.asarray(emb)
    coverage = float((EP * (ES >= 0)).sum() / max((EP).sum(), 1e-9))
    print(f"specd-distill: {len(X)} training rows ({int(W.sum())} target positions), "
          f"{len(EX)} held-out rows; head of {len(head_ids)} tokens covers "
          f"{coverage:.3f} of the held-out top-{train['top_n']} target mass", file=sys.stderr)

    opt = make_optimizer(args)
    state = opt.init(params)

    divergence = distill_loss(args)

    def loss_fn(p, x, s, pr, w):
        return divergence(forward(p, emb, x, cfg), s, pr, w)

    @jax.jit
    def step(p, st, x, s, pr, w):
        loss, g = jax.value_and_grad(loss_fn)(p, x, s, pr, w)
        upd, st = opt.update(g, st, p)
        return optax.apply_updates(p, upd), st, loss

    def batch_of(idx):
        L = min(args.seq_len, int(-(-lengths[idx].max() // 32) * 32))
        return (X[idx, :L], S[idx, :L], P[idx, :L], W[idx, :L]), int(W[idx, :L].sum())

    before = evaluate(params, emb, cfg, EX, ES, EP, EW, etemps, args.batch)
    print(f"specd-distill: before training: held-out greedy acceptance "
          f"{before['greedy_acceptance']:.3f}, sampled {before['sampled_acceptance']:.3f}",
          file=sys.stderr)
    params, curve, train_secs = run_steps(args, step, params, state, lengths, batch_of)
    after = evaluate(params, emb, cfg, EX, ES, EP, EW, etemps, args.batch)
    print(f"specd-distill: after training: held-out greedy acceptance "
          f"{after['greedy_acceptance']:.3f}, sampled {after['sampled_acceptance']:.3f}",
          file=sys.stderr)

    recipe = dict(layers=args.layers, init_layers=src_layers, head_vocab=len(head_ids),
                  steps=args.steps, batch=args.batch, seq_len=args.seq_len, lr=args.lr,
                  seed=args.seed, layer_type=args.layer_type, head_type=args.head_type,
                  loss=args.loss, tv_weight=args.tv_weight)
    out = args.output or os.path.join(d, "draft.gguf")
    try:
        export_gguf(target, params, head_ids, out, args.layer_type, args.head_type, recipe)
    except OSError as e:
        die(f"--output {out}: cannot write ({e})")
    # The exported (quantized) weights, held out once more: what the engine will run.
    xp, _ = load_exported(out, target)
    exported = evaluate(jax.tree_util.tree_map(jnp.asarray, xp), emb, cfg, EX, ES, EP, EW,
                        etemps, args.batch)
    from importlib.metadata import version
    versions = {p: version(p) for p in ("jax", "jaxlib", "optax", "gguf", "numpy")}
    report = dict(recipe=recipe, versions=versions, before=before, after=after, exported=exported,
                  loss_curve=curve, train_seconds=train_secs, head_coverage=coverage,
                  output=out, target=args.target,
                  train_rows=len(X), train_positions=int(W.sum()))
    with open(os.path.join(d, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot_curve(curve, os.path.join(d, "loss.png"), report)
    print(f"specd-distill: wrote {out} (exported held-out greedy acceptance "
          f"{exported['greedy_acceptance']:.3f}, sampled {exported['sampled_acceptance']:.3f}); "
          f"report in {d}/report.json and {d}/loss.png", file=sys.stderr)


def cmd_train_eagle(args):
    """`train --kind eagle`: the feature-conditioned draft (tools/distill/eagle.py)."""
    import jax
    import jax.numpy as jnp
    import optax
    import eagle
    check_target(args)
    if args.head_vocab < 2 or args.steps < 1 or args.batch < 1 or args.seq_len < 8 \
            or not (args.lr > 0) or not (1 <= args.depths <= 8):
        die("--head-vocab, --steps, --batch, --seq-len, --lr must be positive and --depths in "
            f"[1, 8] (got head_vocab={args.head_vocab} steps={args.steps} batch={args.batch} "
            f"seq_len={args.seq_len} lr={args.lr} depths={args.depths})")
    target = Gguf(args.target)
    init_layer = target.L - 1 if args.init_layers == "" else int(args.init_layers)
    if not 0 <= init_layer < target.L:
        die(f"--init-layers {args.init_layers!r}: one layer index in [0, {target.L}) for eagle")
    d = args.out_dir
    sets = read_training_sets(args, target)
    head_ids = sets.head_ids
    X, S, P, W, EX, ES, EP, EW = sets.X, sets.S, sets.P, sets.W, sets.EX, sets.ES, sets.EP, sets.EW
    etemps, lengths = sets.etemps, sets.lengths
    cfg = forward_config(target)

    def features(name, XX):
        # The serving engine's hidden states (`specd hidden`): what the draft is fed when it
        # serves (the JAX float forward agrees to ~1e-3: distill_test).
        path = os.path.join(d, f"{name}.hidden")
        data = os.path.join(d, f"{name}.bin")
        if os.path.isfile(path) and os.path.getmtime(path) > os.path.getmtime(data):
            return read_hidden(path, XX.shape, target.D)  # made from this data already
        cmd = [args.specd, "hidden", "-m", args.target, "--data", os.path.join(d, f"{name}.bin"),
               "-o", path, "--max-tokens", str(args.seq_len)]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        print("specd-distill: " + " ".join(cmd), file=sys.stderr)
        if subprocess.call(cmd) != 0:
            die(f"specd hidden failed for {name}.bin")
        return read_hidden(path, XX.shape, target.D)
    EF = features("eval", EX)
    F = features("train", X)

    params, emb = eagle.init_params(target, head_ids, init_layer, args.seed)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    emb = jnp.asarray(emb)
    opt = make_optimizer(args)
    state = opt.init(params)

    def loss_fn(p, x, f, s, pr, w, m):
        return eagle.chain_loss(p, emb, x, f, s, pr, w, cfg, args.depths, kl_loss, m,
                                args.feature_weight)

    @jax.jit
    def step(p, st, x, f, s, pr, w, m):
        loss, g = jax.value_and_grad(loss_fn)(p, x, f, s, pr, w, m)
        upd, st = opt.update(g, st, p)
        return optax.apply_updates(p, upd), st, loss

    def batch_of(idx):
        idx = np.sort(idx)  # F may be a memory map: read in order
        L = min(args.seq_len, int(-(-lengths[idx].max() // 32) * 32))
        mask = (np.arange(L)[None, :] < lengths[idx][:, None]).astype(np.float32)
        return ((X[idx, :L], np.asarray(F[idx, :L]), S[idx, :L], P[idx, :L], W[idx, :L], mask),
                int(W[idx, :L].sum()))

    def held_out(p):
        return eagle.evaluate(p, emb, cfg, EX, EF, ES, EP, EW, etemps, args.batch, args.depths)
    before = held_out(params)
    print(f"specd-distill: before training: held-out greedy acceptance per position "
          f"{fmt(before['greedy_per_position'])}, sampled {before['sampled_acceptance']:.3f}",
          file=sys.stderr)
    params, curve, train_secs = run_steps(args, step, params, state, lengths, batch_of)
    after = held_out(params)
    print(f"specd-distill: after training: held-out greedy acceptance per position "
          f"{fmt(after['greedy_per_position'])} (accepted length "
          f"{after['greedy_accepted_length']:.2f} at k {args.depths}), sampled "
          f"{after['sampled_acceptance']:.3f}", file=sys.stderr)
    recipe = dict(kind="eagle", init_layer=init_layer, depths=args.depths,
                  feature_weight=args.feature_weight,
                  head_vocab=len(head_ids), steps=args.steps, batch=args.batch,
                  seq_len=args.seq_len, lr=args.lr, seed=args.seed,
                  layer_type=args.layer_type, head_type=args.head_type)
    out = args.output or os.path.join(d, "draft.gguf")
    try:
        export_gguf(target, eagle.as_export(params), head_ids, out, args.layer_type,
                    args.head_type, recipe)
    except OSError as e:
        die(f"--output {out}: cannot write ({e})")
    xp, _ = load_exported(out, target)
    exported = held_out(jax.tree_util.tree_map(jnp.asarray, eagle.from_export(xp)))
    from importlib.metadata import version
    versions = {p: version(p) for p in ("jax", "jaxlib", "optax", "gguf", "numpy")}
    report = dict(recipe=recipe, versions=versions, before=before, after=after,
                  exported=exported, loss_curve=curve, train_seconds=train_secs,
                  output=out, target=args.target, train_rows=len(X),
                  train_positions=int(W.sum()))
    with open(os.path.join(d, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot_curve(curve, os.path.join(d, "loss.png"), report)
    print(f"specd-distill: wrote {out} (exported held-out greedy acceptance per position "
          f"{fmt(exported['greedy_per_position'])}, accepted length "
          f"{exported['greedy_accepted_length']:.2f}, sampled "
          f"{exported['sampled_acceptance']:.3f}); report in {d}/report.json", file=sys.stderr)


def fmt(xs):
    return " ".join(f"{x:.3f}" for x in xs)


def plot_curve(curve, path, report):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    xs, ys = zip(*curve)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, ys)
    loss = report["recipe"].get("loss", "kl")
    ylabel = {"kl": "KL(target || draft), nats", "tv": "total variation",
              "kl+tv": "KL + %g x TV" % report["recipe"].get("tv_weight", 1.0)}
    ax.set_xlabel("step"); ax.set_ylabel(ylabel.get(loss, loss))
    ax.set_title("specd-distill: held-out greedy acceptance %.2f -> %.2f" % (
        report["before"]["greedy_acceptance"], report["exported"]["greedy_acceptance"]))
    ax.grid(alpha=0.3)
    fig.tight_layout(); fig.savefig(path, dpi=100); plt.close(fig)


def cmd_forward(args):
    """Prints JSON logits of the exported draft for --tokens (full vocabulary, -inf outside the
    head): the training framework's forward, compared with `specd logits` by the tests."""
    import jax.numpy as jnp
    target = Gguf(args.target)
    params, ids = load_exported(args.draft, target)
    emb = jnp.asarray(target.w("token_embd.weight"))
    cfg = forward_config(target)
    toks = np.asarray([[int(t) for t in args.tokens.split(",")]], np.int32)
    if "eagle" in params:  # row t is fed row t of --features (f32 [tokens, D])
        import eagle
        if not args.features:
            die(f"--draft {args.draft} is feature-conditioned: --features is required")
        feats = np.fromfile(args.features, np.float32).reshape(1, toks.shape[1], target.D)
        lg = np.asarray(eagle.rows_forward(eagle.from_export(params), emb, jnp.asarray(toks),
                                           jnp.asarray(feats), cfg)[0])[0]
    else:
        lg = np.asarray(forward(params, emb, jnp.asarray(toks), cfg))[0]
    full = np.full((lg.shape[0], target.vocab), -np.inf, np.float32)
    full[:, ids] = lg
    full.astype(np.float32).tofile(args.out)


def train_any(args):
    if args.kind == "eagle" and args.loss != "kl":
        die(f"--loss {args.loss}: an eagle draft trains on the KL (with its feature regression)")
    return cmd_train_eagle(args) if args.kind == "eagle" else cmd_train(args)


def cmd_hidden(args):
    """The target's last hidden state at every token (what eagle drafts are trained on),
    compared with `specd logits --hidden-out` by the tests."""
    import jax.numpy as jnp
    import eagle
    target = Gguf(args.target)
    toks = np.asarray([[int(t) for t in args.tokens.split(",")]], np.int32)
    F = eagle.target_features(target, toks, np.asarray([toks.shape[1]]), 1, None)
    F = np.asarray(F, np.float32)  # float16 in training: the test reads the rounding too
    F[0].tofile(args.out)


def build_parser():
    """The command line (also parsed by distill_test against make_default_draft.sh's flags)."""
    ap = argparse.ArgumentParser(prog="specd-distill", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p):
        p.add_argument("--target", required=True, help="target GGUF")
        p.add_argument("--out-dir", required=True, help="work directory")
        p.add_argument("--seed", type=int, default=0)

    def data_flags(p):
        p.add_argument("--specd", default=os.path.join(HERE, "..", "..", "build", "tools", "specd"))
        p.add_argument("--max-new-tokens", type=int, default=128)
        p.add_argument("--temperatures", default="0,0.8")
        p.add_argument("--train-temperature-mode", choices=["each", "cycle"], default="each",
                       help="training prompts: each at every temperature, or prompt i at "
                            "temperature i mod their count (more prompts, same responses)")
        p.add_argument("--gen-batch", type=int, default=16)
        p.add_argument("--threads", type=int, default=0)
        p.add_argument("--num-train", type=int, default=1200)
        p.add_argument("--num-eval", type=int, default=64)
        p.add_argument("--num-passage", type=int, default=0,
                       help="training prompts beyond --num-train that quote a passage or a "
                            "program (summarise, rewrite, copy, answer from it; passages.py)")
        p.add_argument("--prompt-seed", type=int, default=0, help="shuffles the prompt sets")

    def train_flags(p):
        p.add_argument("--kind", choices=["llama", "eagle"], default="llama",
                       help="llama: a small Llama draft; eagle: one layer over the target's "
                            "hidden state (tools/distill/eagle.py)")
        p.add_argument("--depths", type=int, default=4, help="eagle: chain depths trained")
        p.add_argument("--feature-weight", type=float, default=1.0,
                       help="eagle: weight of the hidden-state regression beside the KL")
        p.add_argument("--layers", type=int, default=2)
        p.add_argument("--init-layers", default="", help="target layers to start from, e.g. 0,1")
        p.add_argument("--head-vocab", type=int, default=8192)
        p.add_argument("--steps", type=int, default=300)
        p.add_argument("--batch", type=int, default=16)
        p.add_argument("--seq-len", type=int, default=256)
        p.add_argument("--lr", type=float, default=5e-4)
        p.add_argument("--loss", choices=["kl", "tv", "kl+tv"], default="kl",
                       help="llama: forward KL, total variation, or KL + --tv-weight x TV")
        p.add_argument("--tv-weight", type=float, default=1.0, help="with --loss kl+tv")
        p.add_argument("--log-every", type=int, default=10)
        p.add_argument("--layer-type", choices=EXPORT_TYPES, default="q8_0")
        p.add_argument("--head-type", choices=EXPORT_TYPES, default="q8_0")
        p.add_argument("--output", default="", help="draft GGUF (default OUT_DIR/draft.gguf)")

    p = sub.add_parser("prompts"); common(p); data_flags(p); p.set_defaults(fn=cmd_prompts)
    p = sub.add_parser("data"); common(p); data_flags(p); p.set_defaults(fn=cmd_data)
    p = sub.add_parser("train"); common(p); train_flags(p)
    p.add_argument("--specd", default=os.path.join(HERE, "..", "..", "build", "tools", "specd"))
    p.add_argument("--threads", type=int, default=0)
    p.set_defaults(fn=train_any)
    p = sub.add_parser("run", help="prompts + data + train + export + report")
    common(p); data_flags(p); train_flags(p)
    p.set_defaults(fn=lambda a: (cmd_prompts(a), cmd_data(a), train_any(a)))
    p = sub.add_parser("forward")
    p.add_argument("--target", required=True); p.add_argument("--draft", required=True)
    p.add_argument("--tokens", required=True); p.add_argument("--out", required=True)
    p.add_argument("--features", default="", help="eagle drafts: f32 [tokens, D] row features")
    p.set_defaults(fn=cmd_forward)
    p = sub.add_parser("hidden", help="the target's final hidden states (JAX), f32 [tokens, D]")
    p.add_argument("--target", required=True); p.add_argument("--tokens", required=True)
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_hidden)
    return ap


def main():
    args = build_parser().parse_args()
    if getattr(args, "out_dir", None):
        try:
            os.makedirs(args.out_dir, exist_ok=True)
            probe = os.path.join(args.out_dir, ".write-test")
            open(probe, "w").close(); os.remove(probe)
        except OSError as e:
            die(f"--out-dir {args.out_dir}: not writable ({e.strerror})")
    if getattr(args, "num_train", 1) < 1 or getattr(args, "num_eval", 1) < 1:
        die("--num-train and --num-eval must be >= 1 (an empty prompt set trains nothing)")
    if getattr(args, "num_passage", 0) < 0:
        die(f"--num-passage must be >= 0 (got {args.num_passage})")
    args.fn(args)


if __name__ == "__main__":
    main()
