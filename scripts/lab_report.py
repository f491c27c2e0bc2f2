#!/usr/bin/python3
"""The lab's report: reads DIR/results.json (written by `normlab lab`), writes one PNG per measured claim
and DIR/index.html, self-contained (plots embedded as base64 data URIs). Sections follow the source
article's order: neuron -> layer -> LayerNorm math -> LN vs BN -> F vs T on speech -> Pre/Post placement ->
gradient flow at init -> warmup -> layer utilization -> variants. Each claim shows its text, plot, tables,
verdict, rule, reason and the command that reruns it alone.

Usage: /usr/bin/python3 scripts/lab_report.py DIR/results.json DIR
Needs Debian's python3-matplotlib (scripts/install-deps); run with /usr/bin/python3.
"""
import base64
import html
import json
import math
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as e:  # pragma: no cover
    sys.exit(f"lab_report.py: matplotlib is missing ({e}); install python3-matplotlib and run with /usr/bin/python3")

SECTIONS = [
    ("neuron", "1. The neuron", [],
     "A neuron computes a weighted sum of its inputs plus a bias, then a nonlinearity. Its output scale depends "
     "on the scale of its inputs and weights, which is why deep stacks need their activations kept in range."),
    ("layer", "2. The layer", [],
     "A layer is many neurons reading the same input: its output is a vector of features per sample (per token). "
     "\"Which numbers go in one group\" is the question every normalization answers: LayerNorm groups the "
     "features of one layer for one sample."),
    ("layernorm-math", "3. LayerNorm math: worked examples", [1], ""),
    ("ln-vs-bn", "4. LayerNorm vs BatchNorm", [2], ""),
    ("f-vs-t", "5. F vs T normalization on speech", [3], ""),
    ("placement", "6. Pre/Post placement", [4, 7], ""),
    ("gradient-flow", "7. Gradient flow at initialization", [5], ""),
    ("residual-growth", "8. Residual-stream norm growth", [10], ""),
    ("warmup", "9. Warmup", [6, 12], ""),
    ("layer-utilization", "10. Layer utilization and token similarity", [8, 9], ""),
    ("variants", "11. Variants", [11],
     "The placements between Pre-LN and Post-LN (docs/placements.md; `normlab train --placement ...`) in the warmup "
     "experiment's setting without warmup. The token similarity and residual-stream norms per layer of the same "
     "runs are plotted with them."),
]

VERDICT_COLORS = {
    "reproduced": "#1a7f37",
    "reproduced-with-correction": "#9a6700",
    "not-reproduced": "#cf222e",
    "inconclusive": "#57606a",
}
ARM_COLORS = {"post-nowarmup": "#cf222e", "post-warmup": "#fb8500", "pre-nowarmup": "#0969da",
              "pre-warmup": "#8250df", "post": "#cf222e", "pre": "#0969da", "b2t": "#fb8500",
              "siamese": "#1a7f37", "sandwich": "#8250df", "deepnorm": "#bf3989", "mixln": "#9a6700",
              "lns": "#57606a", "dyt": "#0a3069"}


def num(v):
    return float(v) if isinstance(v, (int, float)) and v is not None and math.isfinite(v) else float("nan")


def fmt(v):
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.4g}"
    if isinstance(v, (list, dict)):
        return html.escape(json.dumps(v))
    return html.escape(str(v))


def save(fig, out_dir, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def img_tag(path, alt):
    with open(path, "rb") as f:
        data = base64.b64encode(f.read()).decode("ascii")
    return f'<img class="plot" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def mean(xs):
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


# ---- plots per claim -------------------------------------------------------------------------------
def plot_claim1(c, out_dir):
    ex = {e["name"]: e for e in c["data"].get("worked_examples", [])}
    if not ex:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    e = ex.get("layer-output")
    if e:
        y = next(k["actual"] for k in e["checks"] if k["quantity"] == "y")
        xs = range(len(e["input"]))
        axes[0].bar([x - 0.2 for x in xs], e["input"], width=0.4, label="layer output x")
        axes[0].bar([x + 0.2 for x in xs], y, width=0.4, label="LayerNorm(x)")
        axes[0].axhline(0, color="k", lw=0.5)
        axes[0].set_title("[1, 2, 3] -> mean 2 -> [-1.22, 0, 1.22]")
        axes[0].legend(fontsize=8)
    for ax, name, title in ((axes[1], "speech-over-F", "over F (per frame)"),
                            (axes[2], "speech-over-T", "over T (per band)")):
        e = ex.get(name)
        if not e:
            continue
        y = next(k["actual"] for k in e["checks"] if k["quantity"] == "y")
        f, t = e["input_shape"]
        grid = [y[i * t:(i + 1) * t] for i in range(f)]
        im = ax.imshow(grid, cmap="coolwarm", vmin=-1.5, vmax=1.5)
        for i in range(f):
            for j in range(t):
                ax.text(j, i, f"{grid[i][j]:.2f}", ha="center", va="center", fontsize=9)
        ax.set_title(f"[[1,2,3],[3,4,5]] {title}")
        ax.set_xlabel("T (frames)")
        ax.set_ylabel("F (bands)")
        fig.colorbar(im, ax=ax, fraction=0.046)
    return [save(fig, out_dir, "claim1_worked_examples.png")]


def plot_claim2(c, out_dir):
    ps = c.get("per_seed", [])
    if not ps:
        return []
    keys = [("batch 64 vs 2", "ln_batch", "bn_batch"), ("zero padding", "ln_pad", "bn_pad"),
            ("train vs eval", None, "bn_train_eval"), ("batch 1, [1,1,C]: BN vs LN", "batch1_bn_vs_ln", None)]
    floor = 1e-9
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for i, (label, ln, bn) in enumerate(keys):
        if ln:
            v = [max(num(s["values"][ln]), floor) for s in ps]
            ax.scatter([i - 0.1] * len(v), v, color="#0969da", label="LayerNorm" if i == 0 else None)
        if bn:
            v = [max(num(s["values"][bn]), floor) for s in ps]
            ax.scatter([i + 0.1] * len(v), v, color="#cf222e", label="BatchNorm" if i == 0 else None)
    ax.set_xticks(range(len(keys)), [k[0] for k in keys], fontsize=8)
    ax.set_yscale("log")
    ax.axhline(1e-6, color="k", ls=":", lw=0.8)
    ax.set_ylabel("max |Δ output| (0 drawn at 1e-9)")
    ax.set_title("does the output of the same values change?")
    ax.legend(fontsize=8)
    out = [save(fig, out_dir, "claim2_ln_vs_bn.png")]
    mlp = c.get("data", {}).get("mlp", [])
    if mlp:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
        arms = [("ln", 64), ("ln", 2), ("bn", 64), ("bn", 2)]
        colors = {"ln": "#0969da", "bn": "#cf222e"}
        for i, (norm, b) in enumerate(arms):
            ev = [num(a["eval_val"]) for r in mlp for a in r["arms"] if a["norm"] == norm and a["batch"] == b]
            gap = [num(a["gap"]) for r in mlp for a in r["arms"] if a["norm"] == norm and a["batch"] == b]
            axes[0].scatter([i] * len(ev), ev, color=colors[norm])
            axes[1].scatter([i] * len(gap), gap, color=colors[norm])
        u = num(mlp[0].get("unigram_val"))
        if math.isfinite(u):
            axes[0].axhline(u, color="k", ls="--", lw=1, label="unigram U")
            axes[0].legend(fontsize=8)
        for ax in axes:
            ax.set_xticks(range(len(arms)), [f"{n.upper()} batch {b}" for n, b in arms], fontsize=8)
        axes[0].set_ylabel("eval-mode validation loss")
        axes[0].set_title("next-byte MLP, same examples seen")
        axes[1].axhline(0, color="k", lw=0.5)
        axes[1].set_ylabel("train-mode − eval-mode val loss")
        axes[1].set_title("train vs eval mode (BatchNorm: batch vs running statistics)")
        out.append(save(fig, out_dir, "claim2_mlp.png"))
    return out


C3_PLOTTED = ["f-ln", "t-cmvn", "t-then-f", "f-then-t"]  # unit-variance front ends: one scale


def plot_claim3(c, out_dir):
    res = c.get("data", {}).get("residuals")
    if not res:
        return []
    mean = res["mean"]
    kinds = [k for k in res["corruptions"] if k != "clean"]
    fes = [f for f in C3_PLOTTED if f in res["front_ends"]]
    colors = {"f-ln": "#0969da", "t-cmvn": "#cf222e", "t-then-f": "#8250df", "f-then-t": "#1a7f37"}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    w = 0.8 / max(len(fes), 1)
    for i, fe in enumerate(fes):
        xs = [j + (i - (len(fes) - 1) / 2) * w for j in range(len(kinds))]
        ax.bar(xs, [num(mean.get(k, {}).get(fe)) for k in kinds], width=w, color=colors.get(fe), label=fe)
    ax.set_xticks(range(len(kinds)), kinds, fontsize=8)
    ax.set_ylabel("mean RMS residual (unit-variance features)")
    ax.set_title(f"N(clean) vs N(corrupted), {res.get('utterances', '?')} test utterances")
    ax.legend(fontsize=8)
    return [save(fig, out_dir, "claim3_residuals.png")]


def grad_profiles(c):
    return c["data"].get("profiles", [])


def plot_claim4(c, out_dir):
    prof = [p for p in grad_profiles(c) if p.get("dx")]
    if not prof:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    depths = sorted({p["layers"] for p in prof})
    for placement in ("post", "pre"):
        rs = []
        for L in depths:
            vals = [num(p["dx"][0]) / num(p["dx"][-1]) for p in prof
                    if p["placement"] == placement and p["layers"] == L]
            rs.append(vals)
            axes[0].scatter([L] * len(vals), vals, color=ARM_COLORS[placement], s=12)
        axes[0].plot(depths, [mean(v) for v in rs], "-o", color=ARM_COLORS[placement], label=f"{placement}-LN")
    axes[0].axhline(0.5, color="k", ls=":", lw=1, label="threshold 0.5")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("depth L")
    axes[0].set_ylabel("‖∂L/∂x_1‖ / ‖∂L/∂x_L‖")
    axes[0].set_title("gradient reaching block 1 vs block L")
    axes[0].legend(fontsize=8)
    Lmax = depths[-1]
    for placement in ("post", "pre"):
        for p in prof:
            if p["placement"] == placement and p["layers"] == Lmax:
                axes[1].plot(range(1, Lmax + 1), [num(v) for v in p["dx"]], color=ARM_COLORS[placement],
                             alpha=0.7, label=f"{placement}-LN seed {p['seed']}")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("block l (input side -> output side)")
    axes[1].set_ylabel("‖∂L/∂x_l‖ (mean over tokens)")
    axes[1].set_title(f"gradient w.r.t. each block's input at init, L={Lmax}")
    axes[1].legend(fontsize=7)
    return [save(fig, out_dir, "claim4_identity_path.png")]


def plot_claim5(c, out_dir):
    prof = grad_profiles(c)
    if not prof:
        return []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    depths = sorted({p["layers"] for p in prof})
    styles = ["-", "--", ":", "-."]
    for ax, placement in ((axes[0], "post"), (axes[1], "pre")):
        for i, L in enumerate(depths):
            runs = [p for p in prof if p["placement"] == placement and p["layers"] == L]
            if not runs:
                continue
            m = [mean([num(r["ffn2"][l]) for r in runs]) for l in range(L)]
            ax.plot(range(1, L + 1), m, styles[i % 4], marker=".", label=f"L={L}")
        ax.set_yscale("log")
        ax.set_xlabel("layer l")
        ax.set_ylabel("‖∇W_ffn2‖ (mean over seeds)")
        ax.set_title(f"{placement}-LN at init")
        ax.legend(fontsize=8)
    last = [mean([num(p["ffn2"][-1]) for p in prof if p["placement"] == "pre" and p["layers"] == L]) for L in depths]
    axes[2].plot(depths, last, "o-", color=ARM_COLORS["pre"], label="Pre-LN last layer")
    if last and math.isfinite(last[0]):
        axes[2].plot(depths, [last[0] * math.sqrt(depths[0] / L) for L in depths], "k:", label="∝ 1/√L")
    axes[2].set_xscale("log", base=2)
    axes[2].set_yscale("log")
    axes[2].set_xlabel("depth L")
    axes[2].set_title("Pre-LN last-layer ‖∇W_ffn2‖ vs depth")
    axes[2].legend(fontsize=8)
    return [save(fig, out_dir, "claim5_gradnorms.png")]


def curve(run):
    pts = [(s, v) for s, v in run.get("val", []) if v is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_val_curves(ax, runs, unigram=None):
    seen = set()
    for r in runs:
        xs, ys = curve(r)
        arm = r["arm"]
        ax.plot(xs, ys, color=ARM_COLORS.get(arm, None), alpha=0.8, lw=1.2,
                label=arm if arm not in seen else None)
        seen.add(arm)
        if r.get("diverged"):
            ax.annotate("diverged", (xs[-1] if xs else 0, ys[-1] if ys else 0), fontsize=7)
    if unigram is not None and math.isfinite(num(unigram)):
        ax.axhline(num(unigram), color="k", ls="--", lw=1, label="unigram level U")
        ax.axhline(num(unigram) - 0.5, color="k", ls=":", lw=0.8, label="U − 0.5 (trained)")
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats)")
    ax.legend(fontsize=8)


def plot_claim6(c, out_dir):
    runs = c["data"].get("runs", [])
    if not runs:
        return []
    fig, ax = plt.subplots(figsize=(8, 4))
    plot_val_curves(ax, runs, c["data"].get("unigram_val"))
    ax.set_title("warmup: validation loss per arm (one line per seed)")
    return [save(fig, out_dir, "claim6_warmup.png")]


def plot_claim7(c, out_dir):
    runs = c["data"].get("runs", [])
    if not runs:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    u = runs[0].get("unigram_val")
    plot_val_curves(axes[0], runs, u)
    ys = [num(r["final_val"]) for r in runs if r["final_val"] is not None]
    if ys:
        axes[0].set_ylim(min(ys) - 0.1, min(ys) + 0.8)
    axes[0].set_title("3 layers, cosine schedule: validation loss")
    seeds = [s["seed"] for s in c.get("per_seed", [])]
    ds = [num(s["values"].get("d")) for s in c.get("per_seed", [])]
    axes[1].bar([str(s) for s in seeds], ds, color=["#1a7f37" if d < 0 else "#cf222e" for d in ds])
    axes[1].axhline(0, color="k", lw=0.5)
    axes[1].set_xlabel("seed")
    axes[1].set_ylabel("d = val(Post) − val(Pre)")
    axes[1].set_title("paired difference (< 0: Post-LN better)")
    return [save(fig, out_dir, "claim7_shallow.png")]


def plot_claim8(c, out_dir):
    rem = c["data"].get("removal", [])
    deep = c["data"].get("deep", [])
    if not rem and not deep:
        return []
    fig, axes = plt.subplots(1, 3 if deep else 2, figsize=(14 if deep else 11, 3.8))
    for arm in sorted({r["arm"] for r in rem}):
        rs = [r for r in rem if r["arm"] == arm]
        L = rs[0]["layers"]
        drop = [mean([num(r["drop_last"][k]) for r in rs]) for k in range(L - 1)]
        skip = [mean([num(r["skip"][l]) for r in rs]) for l in range(L)]
        axes[0].plot(range(1, L), drop, "o-", color=ARM_COLORS.get(arm), label=arm)
        axes[1].plot(range(1, L + 1), skip, "o-", color=ARM_COLORS.get(arm), label=arm)
    axes[0].set_xlabel("k (last blocks dropped)")
    axes[0].set_ylabel("Δ validation loss (mean over seeds)")
    axes[0].set_title("drop the last k blocks")
    axes[0].legend(fontsize=8)
    axes[1].set_xlabel("block skipped alone")
    axes[1].set_title("skip one block")
    axes[1].legend(fontsize=8)
    if deep:
        for r in deep:
            if "removal" not in r:
                continue
            sk = [num(v) for v in r["removal"]["skip"]]
            axes[2].plot(range(1, len(sk) + 1), sk, "o-", color=ARM_COLORS.get(r["arm"]), label=f"{r['arm']}-LN")
        axes[2].set_xlabel("block skipped alone")
        axes[2].set_title(f"{len(deep[0].get('removal', {}).get('skip', [])) or '?'} layers (reference, 1 seed)")
        axes[2].legend(fontsize=8)
    return [save(fig, out_dir, "claim8_layer_removal.png")]


def plot_claim9(c, out_dir):
    cos = c["data"].get("cosine", [])
    if not cos:
        return []
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for arm in sorted({r["arm"] for r in cos}):
        rs = [r for r in cos if r["arm"] == arm and r["cos_final"]]
        if not rs:
            continue
        L = len(rs[0]["cos_final"])
        fin = [mean([num(r["cos_final"][l]) for r in rs]) for l in range(L)]
        ini = [mean([num(r["cos_init"][l]) for r in rs if len(r["cos_init"]) > l]) for l in range(L)]
        ax.plot(range(1, L + 1), fin, "o-", color=ARM_COLORS.get(arm), label=f"{arm} end")
        ax.plot(range(1, L + 1), ini, "x:", color=ARM_COLORS.get(arm), alpha=0.6, label=f"{arm} step 1")
    ax.axhline(0.9, color="k", ls="--", lw=0.8, label="collapse threshold 0.9")
    ax.set_xlabel("layer (after block l)")
    ax.set_ylabel("mean pairwise token cosine")
    ax.set_ylim(-0.1, 1.05)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title("token similarity per layer (mean over seeds)")
    return [save(fig, out_dir, "claim9_token_cosine.png")]


def plot_claim10(c, out_dir):
    prof = [p for p in grad_profiles(c) if p.get("resid")]
    if not prof:
        return []
    depths = sorted({p["layers"] for p in prof})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    styles = ["-", "--", ":", "-."]
    for i, L in enumerate(depths):
        for placement in ("post", "pre"):
            runs = [p for p in prof if p["placement"] == placement and p["layers"] == L]
            if not runs:
                continue
            m = [mean([num(r["resid"][l]) for r in runs]) for l in range(L)]
            axes[0].plot(range(1, L + 1), m, styles[i % 4], color=ARM_COLORS[placement], marker=".",
                         label=f"{placement}-LN L={L}")
            if L == depths[-1]:
                axes[1].plot(range(1, L + 1), [v * v for v in m], "o-", color=ARM_COLORS[placement],
                             label=f"{placement}-LN")
    axes[0].set_xlabel("layer l (after block l)")
    axes[0].set_ylabel("‖x_l‖ (mean over tokens and seeds)")
    axes[0].set_title("residual-stream norm at init")
    axes[0].legend(fontsize=7, ncol=2)
    axes[1].set_xlabel("layer l")
    axes[1].set_ylabel("‖x_l‖²")
    axes[1].set_title(f"squared norm, L={depths[-1]} (Pre-LN: linear in l)")
    axes[1].legend(fontsize=8)
    return [save(fig, out_dir, "claim10_residual_growth.png")]


def plot_claim11(c, out_dir):
    runs = c["data"].get("runs", [])
    if not runs:
        return []
    depths = sorted({r["layers"] for r in runs})
    u = next((num(r["unigram_val"]) for r in runs if r.get("unigram_val") is not None), float("nan"))
    fig, axes = plt.subplots(3, len(depths), figsize=(5.5 * len(depths), 10), squeeze=False)
    for j, L in enumerate(depths):
        ax = axes[0][j]
        for r in runs:
            if r["layers"] != L:
                continue
            xs, ys = curve(r)
            ax.plot(xs, ys, color=ARM_COLORS.get(r["arm"]), lw=2.2 if r["arm"] in ("post", "pre") else 1.2,
                    label=r["arm"])
        if math.isfinite(u):
            ax.axhline(u, color="k", ls="--", lw=1, label="U")
            ax.axhline(u - 0.5, color="k", ls=":", lw=0.8, label="U − 0.5")
        ax.set_title(f"{L} layers, no warmup: validation loss")
        ax.set_xlabel("step")
        ax.legend(fontsize=7, ncol=2)
        for row, key, ylabel in ((1, "cos_final", "token cosine at the end"), (2, "resid_final", "‖x_l‖ at the end")):
            ax = axes[row][j]
            for r in runs:
                if r["layers"] != L or not r.get(key):
                    continue
                ax.plot(range(1, len(r[key]) + 1), [num(v) for v in r[key]], "o-", ms=3,
                        color=ARM_COLORS.get(r["arm"]), label=r["arm"])
            ax.set_xlabel("layer l")
            ax.set_ylabel(ylabel)
            if row == 2:
                ax.set_yscale("log")
            ax.set_title(f"{L} layers: {ylabel} per layer")
            ax.legend(fontsize=7, ncol=2)
    return [save(fig, out_dir, "claim11_variants.png")]


def plot_claim12(c, out_dir):
    runs = c["data"].get("runs", [])
    if not runs:
        return []
    depths = sorted({r["layers"] for r in runs})
    warmups = sorted({r["warmup"] for r in runs})
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    u = next((num(r["unigram_val"]) for r in runs if r.get("unigram_val") is not None), float("nan"))
    for w in warmups:
        ys = [next((num(r["final_val"]) for r in runs if r["layers"] == L and r["warmup"] == w), float("nan"))
              for L in depths]
        axes[0].plot(depths, ys, "o-", label=f"warmup {w}")
    if math.isfinite(u):
        axes[0].axhline(u, color="k", ls="--", lw=1, label="U")
        axes[0].axhline(u - 0.5, color="k", ls=":", lw=0.8, label="U − 0.5 (trained)")
    axes[0].set_xlabel("depth L (Post-LN)")
    axes[0].set_ylabel("final validation loss")
    axes[0].set_title("Post-LN: final loss per depth and warmup")
    axes[0].legend(fontsize=7)
    vals = c.get("per_seed", [{}])[0].get("values", {})
    th = [vals.get(f"threshold_L{L}") for L in depths]
    top = (max(warmups) if warmups else 1) * 1.3 + 1
    axes[1].bar([str(L) for L in depths], [top if t is None else t for t in th],
                color=["#cf222e" if t is None else "#1a7f37" for t in th])
    for i, t in enumerate(th):
        axes[1].text(i, (top if t is None else t) + 0.5, "none of the grid" if t is None else str(t), ha="center",
                     fontsize=8)
    axes[1].set_xlabel("depth L")
    axes[1].set_ylabel("smallest warmup that trains")
    axes[1].set_title("warmup threshold w*(L)")
    return [save(fig, out_dir, "claim12_warmup_depth.png")]


PLOTTERS = {10: plot_claim10, 11: plot_claim11, 12: plot_claim12, 1: plot_claim1, 2: plot_claim2, 3: plot_claim3, 4: plot_claim4, 5: plot_claim5, 6: plot_claim6, 7: plot_claim7, 8: plot_claim8,
            9: plot_claim9}


# ---- HTML ------------------------------------------------------------------------------------------
def table(rows, header):
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in header)
    body = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def per_seed_table(c):
    ps = c.get("per_seed", [])
    if not ps:
        return ""
    keys = []
    for s in ps:
        for k in s["values"]:
            if k not in keys:
                keys.append(k)
    return table([[s["seed"]] + [s["values"].get(k) for k in keys] for s in ps], ["seed"] + keys)


def claim1_table(c):
    rows = []
    for e in c["data"].get("worked_examples", []):
        for k in e["checks"]:
            rows.append([e["name"], k["quantity"], k["expected"], k["actual"], k["max_abs_err"], k["passed"]])
    for e in c["data"].get("exercise_checks", []):
        rows.append([e["name"], "", "", e["detail"], None, e["passed"]])
    return table(rows, ["example", "quantity", "hand answer", "normlab", "max abs err", "passed"])


def run_table(c):
    rows = []
    for r in c["data"].get("runs", []):
        rows.append([r["arm"], r["seed"], r["final_val"], r["unigram_val"], r["diverged"], r.get("seconds")])
    return table(rows, ["arm", "seed", "final val loss", "unigram U", "diverged", "seconds"]) if rows else ""


def claim3_table(c):
    res = c.get("data", {}).get("residuals")
    if not res:
        return ""
    fes = res["front_ends"]
    rows = [[k] + [res["mean"].get(k, {}).get(fe) for fe in fes] for k in res["corruptions"]]
    rows.append(["scale (RMS of N(clean))"] + [res.get("scale", {}).get(fe) for fe in fes])
    return ("<h4>Mean residual per corruption (rows) and front end (columns)</h4>" +
            table(rows, ["corruption"] + fes) +
            "<p>none and the means-only columns (t-cmn, f-mean, *-mean) are in log-mel units; the others are "
            "on the scale of unit-variance features (see the scale row).</p>")


def claim3_rerun(c):
    ds = c.get("data", {}).get("dataset", {})
    lim = f" --limit {ds['limit']}" if ds.get("limit") else ""
    seed = ds.get("seed", 0)
    return ("<p><b>Outside the lab:</b> <code class=\"command\">normlab speech-data --out DIR --seed "
            f"{seed}{lim} &amp;&amp; normlab speech-study --data DIR --no-classifier</code> (these residuals); "
            "without <code>--no-classifier</code> it also trains the keyword classifier behind each front end "
            "(part b, not run by the lab: about 8 minutes). Measured numbers and discussion: "
            "docs/SPEECH_STUDY.md.</p>")


def x_run_table(c):
    rows = [[r["arm"], r["layers"], r["warmup"], r["final_val"], r["unigram_val"], r["diverged"], r.get("seconds")]
            for r in c["data"].get("runs", [])]
    t = table(rows, ["variant", "layers", "warmup", "final val loss", "unigram U", "diverged", "seconds"]) if rows else ""
    for r in c["data"].get("refused", []):
        t += (f'<p class="refused"><b>{html.escape(r["variant"])}: not run.</b> The engine refuses it: '
              f'<code>{html.escape(r["error"])}</code></p>')
    return t


def removal_table(c):
    rows = []
    for r in c["data"].get("removal", []):
        rows.append([r["arm"], r["seed"], r["full"], r["drop_last"], r["skip"]])
    for r in c["data"].get("deep", []):
        if "removal" in r:
            rem = r["removal"]
            rows.append([f"{r['arm']} (deep)", r["seed"], rem["full"], rem["drop_last"], rem["skip"]])
    return table(rows, ["arm", "seed", "val loss (all blocks)", "Δ drop last k=1..", "Δ skip block 1..L"]) if rows else ""


def claim_html(c, out_dir):
    v = c["verdict"]
    color = VERDICT_COLORS.get(v, "#57606a")
    parts = [f'<div class="claim" id="claim-{c["id"]}" data-claim="{c["id"]}" data-verdict="{v}">',
             f'<h3>{"Claim" if c["id"] <= 9 else "Experiment"} {c["id"]}: {html.escape(c["title"])}</h3>',
             f'<blockquote>{html.escape(c["claim"])}</blockquote>',
             f'<p class="verdict" style="background:{color}">verdict: <b>{v}</b></p>',
             f'<p><b>Rule.</b> {html.escape(c["rule"])}</p>',
             f'<p><b>Measured.</b> {html.escape(c["reason"])}</p>']
    if c.get("note"):
        parts.append(f'<p class="note"><b>Note.</b> {html.escape(c["note"])}</p>')
    if not c.get("measured"):
        parts.append('<p class="notyet">Not yet measured — no plot, no numbers.</p>')
    plotter = PLOTTERS.get(c["id"])
    if plotter and c.get("measured"):
        try:
            for p in plotter(c, out_dir):
                parts.append(img_tag(p, f"claim {c['id']} plot"))
        except Exception as e:  # a plot must not hide the numbers
            parts.append(f'<p class="error">plot failed: {html.escape(repr(e))}</p>')
    if c["id"] == 1:
        parts.append(claim1_table(c))
    if c["id"] in (6, 7):
        parts.append(run_table(c))
    if c["id"] in (11, 12):
        parts.append(x_run_table(c))
    if c["id"] == 2 and c.get("data", {}).get("mlp"):
        rows = [[r["seed"], a["norm"], a["batch"], a["lr"], a["steps"], a["eval_val"], a["train_mode_val"], a["gap"]]
                for r in c["data"]["mlp"] for a in r["arms"]]
        parts.append("<h4>Next-byte MLP (trained, informational)</h4>" +
                     table(rows, ["seed", "norm", "batch", "lr", "steps", "eval val loss", "train-mode val loss",
                                  "gap"]))
    if c["id"] == 8:
        parts.append(removal_table(c))
    if c["id"] == 3 and c.get("measured"):
        parts.append(claim3_table(c))
    if c.get("per_seed") and c["id"] != 1:
        parts.append("<h4>Per-seed values read by the rule</h4>" + per_seed_table(c))
    if c.get("config"):
        parts.append("<details><summary>config</summary><pre>" + html.escape(json.dumps(c["config"], indent=1)) +
                     "</pre></details>")
    parts.append(f'<p><b>Rerun alone:</b> <code class="command">{html.escape(c["command"])}</code></p>')
    if c["id"] == 3 and c.get("measured"):
        parts.append(claim3_rerun(c))
    if c.get("run_commands"):
        parts.append("<details><summary>the runs as CLI commands</summary><pre>" +
                     html.escape("\n".join(c["run_commands"])) + "</pre></details>")
    parts.append(f'<p class="wall">wall time: {c.get("wall_s", 0):.1f} s</p></div>')
    return "\n".join(parts)


CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:1em auto;padding:0 1em;color:#1f2328}
h1{margin-bottom:0}section{border-top:2px solid #d0d7de;margin-top:1.5em}
blockquote{border-left:4px solid #d0d7de;margin:0.5em 0;padding:0.2em 0.8em;color:#57606a}
.verdict{color:white;display:inline-block;padding:0.2em 0.6em;border-radius:4px}
table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}td,th{border:1px solid #d0d7de;padding:2px 6px;
max-width:420px;overflow-wrap:anywhere;vertical-align:top}
img.plot{max-width:100%;display:block;margin:0.5em 0}code,pre{background:#f6f8fa;font-size:0.85em}
pre{padding:0.5em;overflow-x:auto}.note{color:#57606a}.notyet{font-style:italic;color:#9a6700}.wall{color:#57606a}
"""

CHECK_SCRIPT = """
<script>
function normlabMarkImages(){var imgs=document.querySelectorAll('img');var ok=0;
for(var i=0;i<imgs.length;i++){var w=imgs[i].naturalWidth;imgs[i].setAttribute('data-natural-width',String(w));
if(imgs[i].complete&&w>0)ok++;}
document.body.setAttribute('data-images',String(imgs.length));document.body.setAttribute('data-images-decoded',String(ok));}
normlabMarkImages();window.addEventListener('load',normlabMarkImages);
</script>
"""


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: /usr/bin/python3 lab_report.py RESULTS.json OUT_DIR")
    with open(sys.argv[1]) as f:
        res = json.load(f)
    out_dir = sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    claims = {c["id"]: c for c in res["claims"]}
    summary = [[f'{c["id"]}', c["title"], c["verdict"]] for c in sorted(claims.values(), key=lambda c: c["id"])]
    doc = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>normlab lab report</title>",
           f"<style>{CSS}</style></head><body>",
           "<h1>normlab lab: the LayerNorm logic chain, measured</h1>",
           f"<p>{'<b>--quick</b> run (reduced sizes). ' if res.get('quick') else ''}seeds {res.get('seeds')}, "
           f"{res.get('jobs')} runs in parallel, started {html.escape(str(res.get('started')))}, "
           f"wall time {res.get('wall_s', 0):.0f} s. Command: <code>{html.escape(str(res.get('command')))}</code></p>",
           "<p>Verdicts come from the numbers by the rules shown in each section (thresholds in "
           "src/lab/verdicts.h); results.json holds every number.</p>",
           "<h2>Summary</h2>",
           table(summary, ["claim", "title", "verdict"])]
    for sid, heading, ids, intro in SECTIONS:
        doc.append(f'<section id="{sid}" data-section="{sid}"><h2>{html.escape(heading)}</h2>')
        if intro:
            doc.append(f"<p>{html.escape(intro)}</p>")
        shown = [claims[i] for i in ids if i in claims]
        if ids and not shown:
            doc.append('<p class="notyet">Not part of this run (see --only).</p>')
        for c in shown:
            doc.append(claim_html(c, out_dir))
        doc.append("</section>")
    doc.append(CHECK_SCRIPT)
    doc.append("</body></html>")
    path = os.path.join(out_dir, "index.html")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(doc))
    os.replace(tmp, path)
    print(f"lab_report.py: wrote {path}")


if __name__ == "__main__":
    main()
