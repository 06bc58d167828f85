"""The router's /metrics around a run, as the loadtest scripts read them (spec_ab.sh,
long_prompt_ttft.sh): what each series grew by between two scrapes (cluster_lib.sh's
scrape_router_metrics), and a histogram's buckets, sum and count from that growth."""


def read(path):
    """{series: value} of a Prometheus text exposition; a series is its name with its labels as
    written, e.g. 'specd_router_step_cost_ratio_count{stage="draft"}'."""
    samples = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        series, value = line.rsplit(" ", 1)
        samples[series] = float(value)
    return samples


def delta(before_path, after_path):
    """What every series of the second scrape grew by since the first."""
    before, after = read(before_path), read(after_path)
    return {series: value - before.get(series, 0.0) for series, value in after.items()}


def histogram(samples, name, label=""):
    """{le: count, ..., 'sum': s, 'count': n} of histogram `name` in `samples`; `label` (e.g.
    'stage="target"') picks one series of a family."""
    h = {}
    for series, value in samples.items():
        base = series.split("{")[0]
        if label and label not in series:
            continue
        if base == name + "_bucket":
            h[float(series.split('le="')[1].split('"')[0])] = value
        elif base in (name + "_sum", name + "_count"):
            h[base[len(name) + 1:]] = value
    return h


def quantile(h, q):
    """The upper bound of the bucket that holds quantile q of histogram h."""
    les = sorted(k for k in h if isinstance(k, float))
    return next((le for le in les if h[le] >= q * h["count"]), float("inf"))
