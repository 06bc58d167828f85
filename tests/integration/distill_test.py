"""specd-distill end to end on a tiny generated model, in seconds: data generation by the serving
engine, training with falling loss, export, load in our engine, and our engine's logits for the
exported draft equal the training framework's (JAX) forward of the exported weights within
1e-3 (float activations; observed ~1e-6). Also: the draft speculates losslessly (greedy output
== plain greedy), so does the draft re-exported at q4_1 (requantize.py), and bad input to the
tool is a clear error. PromptSetTest checks the prompt sets alone: the passage prompts leave the
held-out set as it was and quote nothing a benchmark uses. ShippedDraftTest checks that the
committed draft is what tools/distill/make_default_draft.sh says reproduces it.

Usage: distill_test.py SPECD SPECD_MAKE_TINY_MODEL  (run by ctest as distill_test)
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DISTILL = os.path.join(ROOT, "tools", "distill", "specd_distill.py")
SPECD = MAKE_TINY = None
TOKENS = "1,50,60,70,13,2,100,200,5,33,44,55,66,77"
LOGIT_TOLERANCE = 1e-3


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def distill(*args, ok=True):
    return run([sys.executable, DISTILL, *args], ok=ok)


class DistillTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="specd-distill-test-")
        cls.target = os.path.join(cls.tmp, "target.gguf")
        # Untied head, small weights: a varied next-token distribution (a tied random model
        # repeats its last token with probability ~1).
        run([MAKE_TINY, "-o", cls.target, "--layers", "4", "--dim", "64", "--ffn", "128",
             "--heads", "4", "--kv-heads", "2", "--type", "Q8_0", "--seed", "3", "--untied",
             "--weight-scale", "0.05"])
        cls.work = os.path.join(cls.tmp, "work")
        cls.proc = distill("run", "--target", cls.target, "--out-dir", cls.work, "--specd", SPECD,
                           "--num-train", "40", "--num-eval", "8", "--max-new-tokens", "24",
                           "--layers", "1", "--head-vocab", "128", "--steps", "40",
                           "--batch", "8", "--seq-len", "96", "--lr", "3e-3", "--log-every", "5",
                           "--layer-type", "q8_0", "--head-type", "q8_0")
        with open(os.path.join(cls.work, "report.json")) as f:
            cls.report = json.load(f)
        cls.draft = cls.report["output"]
        # The feature-conditioned draft (--kind eagle) on the same data.
        cls.ework = os.path.join(cls.tmp, "eagle")
        os.makedirs(cls.ework)
        for name in ("train.bin", "eval.bin"):
            shutil.copy(os.path.join(cls.work, name), cls.ework)
        cls.eproc = distill("train", "--target", cls.target, "--out-dir", cls.ework,
                            "--specd", SPECD, "--kind", "eagle", "--depths", "3",
                            "--head-vocab", "128", "--steps", "40", "--batch", "8",
                            "--seq-len", "96", "--lr", "3e-3", "--log-every", "5")
        with open(os.path.join(cls.ework, "report.json")) as f:
            cls.ereport = json.load(f)
        cls.eagle = cls.ereport["output"]

    def test_progress_and_report(self):
        err = self.proc.stderr
        self.assertIn("distill-data:", err)          # generation progress
        self.assertRegex(err, r"step 40/40 loss [0-9.]+ \d+ target tok/s, \d+ s, ETA \d+ s")
        self.assertTrue(os.path.getsize(os.path.join(self.work, "loss.png")) > 1000)
        for key in ("greedy_acceptance", "sampled_acceptance"):
            self.assertGreaterEqual(self.report["exported"][key], 0.0)
            self.assertLessEqual(self.report["exported"][key], 1.0)

    def test_loss_falls_and_acceptance_rises(self):
        curve = self.report["loss_curve"]
        first, last = curve[0][1], np.mean([l for _, l in curve[-3:]])
        self.assertLess(last, 0.7 * first, curve)
        self.assertGreater(self.report["after"]["greedy_acceptance"],
                           self.report["before"]["greedy_acceptance"])

    def test_tv_loss_is_the_total_variation_over_the_buckets(self):
        # Independent twin: full distributions over a vocabulary of 7, a head of 5 tokens (q
        # is 0 outside it), the target's top 3 as buckets plus one for the rest.
        sys.path.insert(0, os.path.dirname(DISTILL))
        import specd_distill
        rng = np.random.default_rng(5)
        V, head, top = 7, [0, 2, 3, 5, 6], 3
        logits = rng.normal(size=(2, 4, len(head))).astype(np.float32)
        pfull = rng.dirichlet(np.ones(V), size=(2, 4))
        weight = np.asarray([[1, 1, 0, 1], [1, 0, 1, 1]], np.float32)
        slots = np.full((2, 4, top), -1, np.int32)
        probs = np.zeros((2, 4, top), np.float32)
        want = 0.0
        for b in range(2):
            for t in range(4):
                q = np.zeros(V)
                e = np.exp(logits[b, t] - logits[b, t].max())
                q[head] = e / e.sum()
                ids = np.argsort(-pfull[b, t])[:top]
                probs[b, t] = pfull[b, t, ids]
                slots[b, t] = [head.index(i) if i in head else -1 for i in ids]
                inside = [i for i in ids if i in head]
                p_rest = 1.0 - sum(pfull[b, t, i] for i in inside)
                q_rest = 1.0 - sum(q[i] for i in inside)
                tv = 0.5 * (sum(abs(pfull[b, t, i] - q[i]) for i in inside) + abs(p_rest - q_rest))
                want += weight[b, t] * tv
        want /= weight.sum()
        got = float(specd_distill.tv_loss(logits, slots, probs, weight))
        self.assertAlmostEqual(got, want, places=5)
        self.assertGreater(got, 0.05)  # the case is not trivially zero

    def test_kl_plus_tv_training_loss_falls(self):
        w = os.path.join(self.tmp, "kltv")
        os.makedirs(w)
        for name in ("train.bin", "eval.bin"):
            shutil.copy(os.path.join(self.work, name), w)
        distill("train", "--target", self.target, "--out-dir", w, "--specd", SPECD,
                "--layers", "1", "--head-vocab", "128", "--steps", "30", "--batch", "8",
                "--seq-len", "96", "--lr", "3e-3", "--log-every", "5", "--loss", "kl+tv",
                "--tv-weight", "2")
        with open(os.path.join(w, "report.json")) as f:
            report = json.load(f)
        self.assertEqual((report["recipe"]["loss"], report["recipe"]["tv_weight"]), ("kl+tv", 2.0))
        curve = report["loss_curve"]
        self.assertLess(np.mean([l for _, l in curve[-3:]]), 0.8 * curve[0][1], curve)
        # (The tiny model's sampled figure, a bound over its top 32 of a flat distribution,
        # moves by noise under either loss; the greedy one is what the KL test checks too.)
        self.assertGreater(report["after"]["greedy_acceptance"],
                           report["before"]["greedy_acceptance"])

    def test_engine_logits_equal_the_training_forward(self):
        eng = os.path.join(self.tmp, "engine.bin")
        jax_out = os.path.join(self.tmp, "jax.bin")
        run([SPECD, "logits", "-m", self.draft, "--borrow-from", self.target, "--tokens", TOKENS,
             "--exact", "-o", eng])
        distill("forward", "--target", self.target, "--draft", self.draft, "--tokens", TOKENS,
                "--out", jax_out)
        n = len(TOKENS.split(","))
        a = np.fromfile(eng, np.float32).reshape(n, -1)
        b = np.fromfile(jax_out, np.float32).reshape(n, -1)
        self.assertEqual(a.shape, b.shape)
        fa, fb = np.isfinite(a), np.isfinite(b)
        self.assertTrue((fa == fb).all(), "the head's tokens differ")
        self.assertEqual(int(fa[0].sum()), 128)
        diff = float(np.abs(a[fa] - b[fb]).max())
        print(f"engine vs JAX forward: max |logit diff| {diff:.2e} "
              f"(max |logit| {np.abs(a[fa]).max():.2f})")
        self.assertLess(diff, LOGIT_TOLERANCE)

    def test_draft_loads_in_specd_generate_and_is_lossless(self):
        base = [SPECD, "generate", "-m", self.target, "-p", "hello there", "-n", "24", "-t", "1",
                "--ignore-eos"]
        plain = run(base).stdout
        spec = run(base + ["--draft", self.draft, "--k", "4"])
        self.assertEqual(spec.stdout, plain)
        self.assertIn("accepted", spec.stderr)

    def test_requantized_draft_is_close_to_the_original_and_lossless(self):
        sys.path.insert(0, os.path.dirname(DISTILL))
        import specd_distill
        requant = os.path.join(os.path.dirname(DISTILL), "requantize.py")
        out = os.path.join(self.tmp, "draft_q4_1.gguf")
        run([sys.executable, requant, "--target", self.target, "--layer-type", "q4_1",
             "--head-type", "q4_1", self.draft, out])
        self.assertLess(os.path.getsize(out), 0.75 * os.path.getsize(self.draft))
        target = specd_distill.Gguf(self.target)
        a, ids_a = specd_distill.load_exported(self.draft, target)
        b, ids_b = specd_distill.load_exported(out, target)
        np.testing.assert_array_equal(ids_a, ids_b)
        for name in ("attn_q", "ffn_down"):
            wa, wb = a["layers"][0][name], b["layers"][0][name]
            # q4_1: 16 levels over each block of 32's range, so at most half a step off.
            err = np.abs(wa - wb).max()
            self.assertGreater(err, 0.0, name)
            self.assertLess(err, 0.6 * (wa.max() - wa.min()) / 15, name)
        base = [SPECD, "generate", "-m", self.target, "-p", "hello there", "-n", "24", "-t", "1",
                "--ignore-eos"]
        spec = run(base + ["--draft", out, "--k", "4"])
        self.assertEqual(spec.stdout, run(base).stdout)
        same = run([sys.executable, requant, "--target", self.target, out, out], ok=False)
        self.assertEqual(same.returncode, 2, same.stderr)
        self.assertIn("output", same.stderr)

    def test_eagle_loss_falls_and_the_chain_is_accepted(self):
        self.assertIn("specd hidden:", self.eproc.stderr)  # the engine computed the features
        curve = self.ereport["loss_curve"]
        first, last = curve[0][1], np.mean([l for _, l in curve[-3:]])
        self.assertLess(last, 0.7 * first, curve)
        before, after = self.ereport["before"], self.ereport["exported"]
        self.assertEqual(len(after["greedy_per_position"]), 3)
        self.assertGreater(after["greedy_acceptance"], before["greedy_acceptance"] + 0.2)
        self.assertGreater(after["greedy_accepted_length"], 1.5)

    def test_eagle_engine_logits_equal_the_training_forward(self):
        n = len(TOKENS.split(","))
        feats = os.path.join(self.tmp, "feats.bin")
        np.random.default_rng(0).normal(0, 2, (n, 64)).astype(np.float32).tofile(feats)
        eng, jax_out = os.path.join(self.tmp, "e_eng.bin"), os.path.join(self.tmp, "e_jax.bin")
        run([SPECD, "logits", "-m", self.eagle, "--borrow-from", self.target, "--tokens", TOKENS,
             "--exact", "--features", feats, "-o", eng])
        distill("forward", "--target", self.target, "--draft", self.eagle, "--tokens", TOKENS,
                "--features", feats, "--out", jax_out)
        a = np.fromfile(eng, np.float32).reshape(n, -1)
        b = np.fromfile(jax_out, np.float32).reshape(n, -1)
        fa = np.isfinite(a)
        self.assertTrue((fa == np.isfinite(b)).all(), "the head's tokens differ")
        diff = float(np.abs(a[fa] - b[fa]).max())
        print(f"eagle engine vs JAX forward: max |logit diff| {diff:.2e}")
        self.assertLess(diff, LOGIT_TOLERANCE)
        # Without its features the draft is a clear error naming them.
        p = run([SPECD, "logits", "-m", self.eagle, "--borrow-from", self.target, "--tokens",
                 TOKENS, "-o", eng], ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("input_features", p.stderr)

    def test_engine_hidden_states_equal_the_training_forward(self):
        # What the target serves the draft (specd logits --hidden-out, like `specd hidden`)
        # against the JAX float forward of the same weights.
        n = len(TOKENS.split(","))
        eng, jax_out = os.path.join(self.tmp, "h_eng.bin"), os.path.join(self.tmp, "h_jax.bin")
        run([SPECD, "logits", "-m", self.target, "--tokens", TOKENS, "--exact", "-o",
             os.path.join(self.tmp, "h_logits.bin"), "--hidden-out", eng])
        distill("hidden", "--target", self.target, "--tokens", TOKENS, "--out", jax_out)
        a = np.fromfile(eng, np.float32).reshape(n, -1)
        b = np.fromfile(jax_out, np.float32).reshape(n, -1)
        diff = float(np.abs(a - b).max())
        print(f"target hidden states, engine vs JAX: max |diff| {diff:.2e} "
              f"(max |h| {np.abs(a).max():.2f}; JAX side rounded to half floats)")
        self.assertLess(diff, 2e-3 * max(1.0, float(np.abs(a).max())))

    def test_eagle_draft_speculates_losslessly(self):
        base = [SPECD, "generate", "-m", self.target, "-p", "hello there", "-n", "24", "-t", "1",
                "--ignore-eos"]
        plain = run(base).stdout
        spec = run(base + ["--draft", self.eagle, "--k", "4"])
        self.assertEqual(spec.stdout, plain)
        m = re.search(r"draft acceptance [0-9.]+ \((\d+)/(\d+)\)", spec.stderr)
        self.assertIsNotNone(m, spec.stderr)
        self.assertGreater(int(m.group(2)), 0)  # it drafted: the features reached it

    def test_a_draft_without_its_target_is_a_clear_error(self):
        p = run([SPECD, "logits", "-m", self.draft, "--tokens", "1,2", "-o",
                 os.path.join(self.tmp, "x.bin")], ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("token_embd.weight", p.stderr)

    def test_corrupt_or_mismatched_draft_is_a_clear_error_naming_both_models(self):
        corrupt = os.path.join(self.tmp, "corrupt.gguf")
        with open(self.draft, "rb") as f:
            data = f.read()
        with open(corrupt, "wb") as f:
            f.write(data[: len(data) // 3])
        p = run([SPECD, "generate", "-m", self.target, "-p", "hi", "-n", "4", "--draft", corrupt],
                ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(corrupt, p.stderr)
        # A draft of another vocabulary: a tiny model with a padded (larger) vocabulary.
        other = os.path.join(self.tmp, "other_vocab.gguf")
        run([MAKE_TINY, "-o", other, "--layers", "1", "--vocab", "512"])
        p = run([SPECD, "generate", "-m", self.target, "-p", "hi", "-n", "4", "--draft", other],
                ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(other, p.stderr)
        self.assertIn(self.target, p.stderr)
        self.assertIn("different vocabularies", p.stderr)

    def test_bad_input_is_a_clear_error(self):
        w = os.path.join(self.tmp, "bad")
        cases = [
            (["train", "--target", os.path.join(self.tmp, "missing.gguf"), "--out-dir", w],
             "--target"),
            (["train", "--target", self.target, "--out-dir", "/proc/no/such/dir"],
             "--out-dir"),
            (["prompts", "--target", self.target, "--out-dir", w, "--num-train", "0"],
             "empty prompt set"),
            (["train", "--target", self.target, "--out-dir", self.work, "--layers", "0"],
             "--layers"),
            (["train", "--target", self.target, "--out-dir", self.work, "--layers", "9"],
             "fewer layers"),
            (["train", "--target", self.target, "--out-dir", self.work, "--head-vocab", "1"],
             "--head-vocab"),
            (["train", "--target", self.target, "--out-dir", self.work, "--lr", "-1"], "--lr"),
            (["train", "--target", self.target, "--out-dir", self.work, "--tv-weight", "-1"],
             "--tv-weight"),
            (["train", "--target", self.target, "--out-dir", self.work, "--kind", "eagle",
              "--loss", "tv"], "--loss"),
            (["train", "--target", self.target, "--out-dir", self.work, "--kind", "eagle",
              "--depths", "0"], "--depths"),
            (["train", "--target", self.target, "--out-dir", self.work, "--kind", "eagle",
              "--init-layers", "7"], "--init-layers"),
        ]
        for args, needle in cases:
            p = distill(*args, ok=False)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(needle, p.stderr, args)
            self.assertNotIn("Traceback", p.stderr, args)
        empty = os.path.join(self.tmp, "empty.jsonl")
        open(empty, "w").close()
        p = run([SPECD, "distill-data", "-m", self.target, "--prompts", empty, "-o",
                 os.path.join(self.tmp, "e.bin")], ok=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("no usable prompt", p.stderr)
        p = run([SPECD, "distill-data", "-m", self.target, "--prompts", empty, "-o", "x",
                 "--top", "0"], ok=False)
        self.assertIn("--top", p.stderr)
        p = run([SPECD, "distill-data", "-m", self.target, "--prompts", empty, "-o", "x",
                 "--temperature-mode", "sometimes"], ok=False)
        self.assertIn("--temperature-mode", p.stderr)

    def test_records_are_the_engines_top_n_log_softmax(self):
        # Each response position's record is the top-N of the engine's own logits for that
        # prefix (by logit, ties to the lower id) with their log-softmax: recomputed here from
        # `specd logits` over the whole record in one forward (the engine is batch- and
        # chunking-invariant, so the batched, token-by-token generation saw the same rows).
        sys.path.insert(0, os.path.dirname(DISTILL))
        import specd_distill
        data = specd_distill.read_data(os.path.join(self.work, "train.bin"))
        top_n = data["top_n"]
        checked = 0
        for r in data["records"][:6]:
            npr, toks = r["num_prompt"], r["tokens"]
            out = os.path.join(self.tmp, "record_logits.bin")
            run([SPECD, "logits", "-m", self.target, "--tokens",
                 ",".join(str(int(t)) for t in toks[:-1]), "--kv-dtype", "f16", "-o", out])
            lg = np.fromfile(out, np.float32).reshape(len(toks) - 1, -1)
            for j in range(len(toks) - npr):
                row = lg[npr - 1 + j]
                want = np.lexsort((np.arange(len(row)), -row))[:top_n]
                self.assertEqual(r["top_ids"][j].tolist(), want.tolist(), f"record position {j}")
                x = row.astype(np.float64)
                log_z = x.max() + np.log(np.exp(x - x.max()).sum())
                np.testing.assert_allclose(r["top_lp"][j], row[want] - log_z, atol=1e-5)
                checked += 1
        self.assertGreater(checked, 20)

    def test_cycled_temperatures_answer_each_prompt_once(self):
        # --temperature-mode cycle: prompt i at temperature i mod 3, one response each; the
        # default answers every prompt at every temperature.
        sys.path.insert(0, os.path.dirname(DISTILL))
        import specd_distill
        prompts = os.path.join(self.work, "train.jsonl")
        temps = [0.0, 0.5, 1.0]
        got = {}
        for mode in ("each", "cycle"):
            out = os.path.join(self.tmp, f"temps_{mode}.bin")
            run([SPECD, "distill-data", "-m", self.target, "--prompts", prompts, "-o", out,
                 "--temperatures", "0,0.5,1", "--temperature-mode", mode, "--limit", "7",
                 "-n", "4"])
            got[mode] = sorted((r["prompt_index"], float(r["temperature"]))
                               for r in specd_distill.read_data(out)["records"])
        self.assertEqual(got["each"], [(i, t) for i in range(7) for t in temps])
        self.assertEqual(got["cycle"], [(i, temps[i % 3]) for i in range(7)])


class PromptSetTest(unittest.TestCase):
    """The prompt sets alone (no model): the passage prompts added to a recipe leave the held-out
    set and the rest of the training set as they were, and quote nothing a benchmark uses."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.dirname(DISTILL))
        import prompts
        cls.prompts = prompts
        cls.plain = prompts.build_sets(300, 64, seed=0)
        cls.with_passages = prompts.build_sets(300, 64, seed=0, num_passage=200)

    def test_passages_follow_the_plain_set_and_leave_the_held_out_set_alone(self):
        (train, evals), (ptrain, pevals) = self.plain, self.with_passages
        self.assertEqual(len(ptrain), 500)
        self.assertEqual(ptrain[:300], train)
        self.assertEqual(pevals, evals)
        with open(os.path.join(os.path.dirname(DISTILL), "eval_prompts.jsonl")) as f:
            committed = [json.loads(line)["prompt"] for line in f]
        self.assertEqual(pevals, committed)
        self.assertEqual(len(set(ptrain)), 500)
        self.assertFalse(set(ptrain) & set(pevals))
        again = self.prompts.build_sets(300, 64, seed=0, num_passage=200)[0]
        self.assertEqual(again, ptrain)

    def test_passage_prompts_quote_a_passage_or_a_program(self):
        passages = self.with_passages[0][300:]
        code = [p for p in passages if "def " in p or "function " in p or "int " in p
                or "class " in p]
        self.assertGreater(len(code), 20)
        self.assertLess(len(code), 80)
        for p in passages:
            self.assertGreater(len(p), 100, p)
            self.assertNotRegex(p, r"\{[A-Za-z0-9]+\}")     # every slot filled
        # A passage keeps one set of names: every sentence of a life names its first
        # sentence's person (by surname after the first).
        lives = [p for p in passages if " was born in " in p]
        self.assertTrue(lives)
        for p in lives:
            text = next(part for part in p.split("\n\n") if " was born in " in part)
            surname = text.split(" was born in ")[0].split()[-1]
            self.assertGreaterEqual(text.count(surname), text.count(". ") + 1, p)

    def test_nothing_a_benchmark_or_the_held_out_set_uses_is_trained_on(self):
        with open(os.path.join(ROOT, "loadtest", "prompt_set.cc"), encoding="utf-8") as f:
            loadtest = f.read()
        self.assertIn("Ekberg", loadtest)          # the loadtest's passage and program
        self.assertIn("load_orders", loadtest)
        for p in self.with_passages[0]:
            for needle in ("Ekberg", "load_orders", "lighthouse", "northern cape"):
                self.assertNotIn(needle, p)
            for subject in self.prompts.EVAL_SUBJECTS:
                self.assertNotIn(subject.lower(), p.lower())

    def test_a_negative_passage_count_is_a_clear_error(self):
        w = tempfile.mkdtemp(prefix="specd-distill-prompts-")
        p = distill("prompts", "--target", "unused.gguf", "--out-dir", w, "--num-passage", "-1",
                    ok=False)
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--num-passage", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        shutil.rmtree(w)


class ShippedDraftTest(unittest.TestCase):
    """The committed draft (drafts/) against the script that reproduces it: the recipe the export
    and requantize.py stored in the file equals make_default_draft.sh's specd-distill flags (as
    the tool's own parser reads them) and its requantization step; its tensors are of the types
    that step writes; the file stays under the repo's 16 MiB."""

    SHIPPED = os.path.join(ROOT, "drafts", "SmolLM2-135M-Instruct.Q4_1.draft.gguf")

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.dirname(DISTILL))
        import specd_distill
        cls.sd = specd_distill
        with open(os.path.join(ROOT, "tools", "distill", "make_default_draft.sh")) as f:
            lines = f.read().replace("\\\n", " ").splitlines()
        run_line = next(line for line in lines if "specd-distill\" run" in line)
        words = shlex.split(run_line)
        cls.args = specd_distill.build_parser().parse_args(words[words.index("run"):])
        req = shlex.split(next(line for line in lines if "requantize.py\"" in line))
        req = req[next(i for i, w in enumerate(req) if w.endswith("requantize.py")) + 1:]
        cls.req_flags = dict(zip(req[:-2:2], req[1:-2:2]))
        cls.req_in, cls.req_out = req[-2], req[-1]
        reader = specd_distill.Gguf(cls.SHIPPED)
        cls.recipe = json.loads(str(reader.field("specd.draft.recipe", "{}")))

    def test_the_recipe_is_the_scripts_training_command(self):
        a = self.args
        self.assertEqual(a.cmd, "run")
        expected = {"layers": a.layers, "init_layers": [int(x) for x in a.init_layers.split(",")],
                    "head_vocab": a.head_vocab, "steps": a.steps, "batch": a.batch,
                    "seq_len": a.seq_len, "lr": a.lr, "seed": a.seed, "loss": a.loss,
                    "tv_weight": a.tv_weight, "layer_type": a.layer_type, "head_type": a.head_type}
        for key, value in expected.items():
            self.assertEqual(self.recipe.get(key), value, key)

    def test_the_file_is_the_scripts_requantization_of_that_export(self):
        self.assertEqual(self.req_in, self.args.output)
        self.assertTrue(self.req_out.endswith("/drafts/" + os.path.basename(self.SHIPPED)),
                        self.req_out)
        self.assertEqual(self.recipe.get("requantized"),
                         {"from": os.path.basename(self.args.output),
                          "layer_type": self.req_flags["--layer-type"],
                          "head_type": self.req_flags["--head-type"]})
        import gguf
        tensors = gguf.GGUFReader(self.SHIPPED).tensors
        matrices = [t for t in tensors if len(t.shape) == 2 and t.name != "output_token_ids"]
        self.assertGreater(len(matrices), 2)
        for t in matrices:  # EXPORT_TYPES are gguf's type names in lower case
            want = self.req_flags["--head-type" if t.name == "output.weight" else "--layer-type"]
            self.assertEqual(t.tensor_type.name.lower(), want, t.name)

    def test_the_file_fits_the_repo(self):
        self.assertLessEqual(os.path.getsize(self.SHIPPED), 16 * 1024 * 1024)


if __name__ == "__main__":
    SPECD, MAKE_TINY = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0], "-v"])
