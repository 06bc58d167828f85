"""specd-loadtest's request lengths: with --ignore-eos 1 (the default) every request runs to
--max-new-tokens, past the model's end of turn; with --ignore-eos 0 it ends there, as a chat
client's request does. In process (--in-process-model) on the default model: the first built-in
prompts ("What is the capital of France?", ...) are answered in well under 128 tokens. A value
other than 0 or 1 is a clear error naming the flag.

Usage: loadtest_test.py SPECD_LOADTEST MODEL.gguf  (ctest: loadtest_test)
"""
import json
import subprocess
import sys
import unittest

LOADTEST = MODEL = None
REQUESTS, MAX_NEW = 3, 128


def loadtest(*flags):
    p = subprocess.run([LOADTEST, "--in-process-model", MODEL, "--threads", "2", "--prompts",
                        "builtin", "--mode", "closed", "--concurrency", "1", "--requests",
                        str(REQUESTS), "--max-new-tokens", str(MAX_NEW), *flags],
                       capture_output=True, text=True, timeout=100)
    return p


class LoadtestTest(unittest.TestCase):
    def point(self, *flags):
        p = loadtest(*flags)
        self.assertEqual(p.returncode, 0, p.stderr[-2000:])
        out = json.loads(p.stdout)
        point = out["points"][0]
        self.assertEqual(point["ok"], REQUESTS, point)
        return out["config"], point

    def test_requests_run_to_max_new_tokens_by_default(self):
        config, point = self.point("--spec", "off")
        self.assertEqual(config["ignore_eos"], 1)
        self.assertEqual(point["output_tokens"], REQUESTS * MAX_NEW)

    def test_requests_end_at_the_end_of_turn_without_ignore_eos(self):
        for spec in ("off", "auto"):
            config, point = self.point("--spec", spec, "--ignore-eos", "0")
            self.assertEqual(config["ignore_eos"], 0)
            self.assertGreater(point["output_tokens"], REQUESTS, spec)
            self.assertLess(point["output_tokens"], REQUESTS * MAX_NEW * 3 // 4, spec)

    def test_greedy_lengths_are_the_same_with_speculation(self):
        _, off = self.point("--spec", "off", "--ignore-eos", "0")
        _, auto = self.point("--spec", "auto", "--ignore-eos", "0")
        self.assertEqual(off["output_tokens"], auto["output_tokens"])

    def test_a_bad_value_names_the_flag(self):
        p = loadtest("--ignore-eos", "2")
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("--ignore-eos", p.stderr)


if __name__ == "__main__":
    LOADTEST, MODEL = sys.argv[1], sys.argv[2]
    unittest.main(argv=[sys.argv[0], "-v"])
