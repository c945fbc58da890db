"""Assemble validation_set.csv: published end-to-end vLLM measurements (validation only, never fit).

Rows come from (1) aiconfigurator-core's bundled silicon corpus (systems/silicon_sample.csv,
Apache-2.0: measured vLLM TTFT/TPOT per deployment), filtered to vLLM + Llama on H100/H200,
(2) numbers stated verbatim on public pages (MANUAL below; each with its URL and how it was
read), and (3) the Splitwise authors' measured Llama-2-70B static batches on DGX-A100/DGX-H100
(SplitwiseSim's data/perf_model.csv, MIT; the mean of each configuration's repetitions).
Run with aiconfigurator-core 0.12.0 and pandas installed, given that file (SPLITWISE_URL):
python bench/data/build_validation.py PATH/TO/perf_model.csv
"""
from __future__ import annotations

import csv
import sys
from importlib import resources
from pathlib import Path

import pandas as pd

OUT = Path(__file__).with_name("validation_set.csv")  # bench/data/
COLUMNS = ["row_id", "source_id", "url", "vllm_version", "gpu", "num_gpus", "tp", "model",
           "weight_dtype", "kv_dtype", "workload", "isl", "osl", "concurrency", "request_rate",
           "num_prompts", "metric", "statistic", "value", "unit", "how_read", "notes"]

BK = "vLLM performance-benchmark CI page; workload per the page: "
H200_VERSION = ("not stated (a build of 2024-10-28, V0 engine: build 9515 is the working H200 "
                "run linked from vllm-project/vllm PR #9768 of that day)")
LAT = ("latency test (vllm bench latency): batch of 8 prompts, input 32 tokens, output 128 "
       "tokens; value = time for the whole batch")
THR = ("throughput test (offline): 200 prompts sampled from ShareGPT with a fixed seed, their "
       "own output lengths; batch chosen by vLLM")
MANUAL = [
    # source_id, url, vllm_version, gpu, num_gpus, tp, model, wdtype, kvdtype, workload, isl, osl,
    # conc, rate, nprompts, metric, stat, value, unit, how_read, notes
    ("vllm_ci_h200", "https://buildkite.com/vllm/performance-benchmark/builds/9515",
     H200_VERSION, "h200-sxm", 8, 1, "meta-llama/Llama-3.1-8B",
     "bf16", "bf16", LAT, 32, 128, 8, "", 8, "batch_latency", "mean", 833.421, "ms",
     "table on page (copied)", BK + "latency_llama8B_tp1"),
    ("vllm_ci_h200", "https://buildkite.com/vllm/performance-benchmark/builds/9515",
     H200_VERSION, "h200-sxm", 8, 4, "meta-llama/Meta-Llama-3-70B",
     "bf16", "bf16", LAT, 32, 128, 8, "", 8, "batch_latency", "mean", 2077.53, "ms",
     "table on page (copied)", BK + "latency_llama70B_tp4 (Llama-3 70B: same shapes as 3.1)"),
    ("vllm_ci_h200", "https://buildkite.com/vllm/performance-benchmark/builds/9515",
     H200_VERSION, "h200-sxm", 8, 1, "meta-llama/Llama-3.1-8B",
     "bf16", "bf16", THR, "", "", "", "", 200, "request_throughput", "run", 22.5674, "req/s",
     "table on page (copied)", BK + "throughput_llama8B_tp1; needs the ShareGPT sample"),
    ("vllm_ci_h200", "https://buildkite.com/vllm/performance-benchmark/builds/9515",
     H200_VERSION, "h200-sxm", 8, 4, "meta-llama/Meta-Llama-3-70B",
     "bf16", "bf16", THR, "", "", "", "", 200, "request_throughput", "run", 9.83905, "req/s",
     "table on page (copied)", BK + "throughput_llama70B_tp4; needs the ShareGPT sample"),
    ("vllm_ci_h100", "https://buildkite.com/elastic/enterprise-search-ruby/builds/571",
     "not stated (vLLM main at that CI build)", "h100-sxm", 8, 1, "meta-llama/Llama-3.1-8B",
     "bf16", "bf16", LAT, 32, 128, 8, "", 8, "batch_latency", "mean", 997.542, "ms",
     "table on page (copied)", BK + "latency_llama8B_tp1, GPU column '8xH100'; the crawl "
     "files this vLLM report under another pipeline's URL"),
    ("vllm_ci_h100", "https://buildkite.com/elastic/enterprise-search-ruby/builds/571",
     "not stated (vLLM main at that CI build)", "h100-sxm", 8, 4, "meta-llama/Meta-Llama-3-70B",
     "bf16", "bf16", LAT, 32, 128, 8, "", 8, "batch_latency", "mean", 2444.47, "ms",
     "table on page (copied)", BK + "latency_llama70B_tp4, GPU column '8xH100'"),
    ("vllm_ci_h100", "https://buildkite.com/elastic/enterprise-search-ruby/builds/571",
     "not stated (vLLM main at that CI build)", "h100-sxm", 8, 1, "meta-llama/Llama-3.1-8B",
     "bf16", "bf16", THR, "", "", "", "", 200, "request_throughput", "run", 19.5005, "req/s",
     "table on page (copied)", BK + "throughput_llama8B_tp1; needs the ShareGPT sample"),
    ("vllm_ci_h100", "https://buildkite.com/elastic/enterprise-search-ruby/builds/571",
     "not stated (vLLM main at that CI build)", "h100-sxm", 8, 4, "meta-llama/Meta-Llama-3-70B",
     "bf16", "bf16", THR, "", "", "", "", 200, "request_throughput", "run", 8.86239, "req/s",
     "table on page (copied)", BK + "throughput_llama70B_tp4; needs the ShareGPT sample"),
    ("vllm_ci_a100", "https://buildkite.com/julialang/opencl-dot-jl/builds/306",
     "not stated (vLLM main at that CI build)", "a100-80gb", 1, 1, "meta-llama/Llama-3.1-8B",
     "bf16", "bf16", LAT, 32, 128, 8, "", 8, "batch_latency", "mean", 1585.43, "ms",
     "table on page (copied)", BK + "latency_llama8B_tp1, GPU A100-SXM4-80GB; the crawl files "
     "this vLLM report under another pipeline's URL"),
    ("vllm_ci_a100", "https://buildkite.com/julialang/opencl-dot-jl/builds/306",
     "not stated (vLLM main at that CI build)", "a100-80gb", 1, 1, "meta-llama/Llama-3.1-8B",
     "bf16", "bf16", THR, "", "", "", "", 200, "request_throughput", "run", 11.0511, "req/s",
     "table on page (copied)", BK + "throughput_llama8B_tp1; needs the ShareGPT sample"),
]
IB = "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/"
IB_NOTE = ("InferenceBench recipe page: H100-80GB-HBM3, vLLM 0.21.0, fp16, workload "
           "llm.inference.chatbot-short (lengths defined by that tool, not on the page)")
for conc, tput, ttft50, _ttft99, tpot50 in ((1, 122.2, 13.98, 14.95, 6.48),
                                           (4, 580.3, 22.75, 32.18, 6.59),
                                           (16, 1384.2, 41.69, 64.71, 10.94),
                                           (64, 1312.3, 86.92, 464.7, 46.91)):
    for metric, stat, val, unit in (("output_throughput", "run", tput, "tok/s"),
                                    ("ttft", "p50", ttft50, "ms"), ("tpot", "p50", tpot50, "ms")):
        MANUAL.append(("inferencebench_h100", IB, "0.21.0", "h100-sxm", 1, 1,
                       "meta-llama/Llama-3.1-8B-Instruct", "fp16", "fp16",
                       "closed loop at fixed concurrency", "", "", conc, "", "", metric, stat,
                       val, unit, "summary table on page (copied)",
                       IB_NOTE + ("; H100 form factor not stated (HBM3 80GB)" if conc == 1
                                  else "")))
RH = ("http://hnkj.keyan123.cn/https/77726476706e69737468656265737421e7e056d235356c587f1cc7af9758/"
      "zh-cn/blog/efficient-and-reproducible-llm-inference-red-hat-mlperf-inference-v51-results")
RH_NOTE = ("Red Hat blog on its MLPerf Inference v5.1 submission (mirror URL as crawled; the "
           "original is on redhat.com): Llama-3.1-8B FP8, vLLM 0.10.0, RHEL 9.6; MLPerf "
           "llama3.1-8b workload (CNN/DailyMail summarization); lengths not on the page")
for gpu, scen, val in (("h100", "offline", 5777), ("h100", "server", 5103),
                       ("l40s", "offline", 1642), ("l40s", "server", 1207)):
    MANUAL.append(("redhat_mlperf51", RH, "0.10.0", "h100-sxm" if gpu == "h100" else "l40s", 1,
                   1, "meta-llama/Llama-3.1-8B (FP8 checkpoint)", "fp8", "not stated",
                   f"MLPerf Inference v5.1 {scen} scenario", "", "", "", "", "",
                   "token_throughput", "run", val, "tok/s", "text on page (copied)",
                   RH_NOTE + ("; H100 form factor not stated" if gpu == "h100" else "")))
MANUAL.append(("musgrave_a100_40gb", "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on",
               "0.23.0", "a100-40gb", 1, 1, "meta-llama/Llama-3.1-8B-Instruct", "bf16", "bf16",
               "vllm bench serve random 1024 in / 128 out, ignore-eos, max-concurrency 1, "
               "request-rate inf, 20 prompts", 1024, 128, 1, "inf", 20, "decode_rate_per_user",
               "approx", 75, "tok/s",
               "text on page: 'about 75 tokens/sec' (approximate; A100 40GB is not in the catalog)",
               "A100 40GB (1.555 TB/s) differs from the catalog's A100 80GB"))


def silicon_rows() -> list[list[object]]:
    path = resources.files("aiconfigurator_core") / "systems" / "silicon_sample.csv"
    df = pd.read_csv(str(path))
    v = df[(df.backend == "vllm") & df.model_path.str.contains("Llama")
           & df.system.isin(("h100_sxm", "h200_sxm", "a100_sxm"))]
    rows = []
    for r in v.itertuples():
        ver = r.backend_version if isinstance(r.backend_version, str) else (
            "not stated (measured 2025-10-29 per silicon_data_source)")
        for metric, val in (("ttft", r.silicon_ttft_ms), ("tpot", r.silicon_tpot_ms)):
            rows.append([
                "aic_silicon", "aiconfigurator-core 0.12.0 systems/silicon_sample.csv (PyPI "
                "aiconfigurator-core; ai-dynamo/aiconfigurator)", ver,
                r.system.replace("_sxm", "-sxm"), int(r.tp_size), int(r.tp_size), r.model_path,
                r.gemm_quant_mode, "not stated", f"{r.mode} serving, fixed isl/osl, closed loop",
                int(r.isl), int(r.osl), int(r.batch_size), "", "", metric, "not stated",
                round(float(val), 3), "ms", f"dataset row id={r.id} (copied)",
                f"silicon_data_source: {r.silicon_data_source}"])
    return rows


SPLITWISE_URL = ("https://github.com/Mutinifni/splitwise-sim/blob/"
                 "8f99e7dc9b407f4ce2488d03dd44c0b8b946dab0/data/perf_model.csv")
#: perf_model.csv's hardware -> catalog GPU (DGX-H100: SXM); its power-capped H100 rows repeat
#: the H100 rows' times and are left out.
SPLITWISE_GPUS = {"a100-80gb": "a100-80gb", "h100-80gb": "h100-sxm"}
SPLITWISE_WORKLOAD = ("static batch: B identical requests of P prompt tokens sent together, "
                      "each forced to generate T tokens; KV cache not reused between requests")
SPLITWISE_NOTE = ("measured by the Splitwise authors (Patel et al., ISCA 2024) on DGX-A100 / "
                  "DGX-H100, fp16; engine version not recorded; token_time is the mean time "
                  "between tokens ((e2e_time - prompt_time) / (T - 1) in the file), prompt_time "
                  "the time to the first token")


def splitwise_rows(path: Path) -> list[list[object]]:
    """Llama-2-70B's configurations in SplitwiseSim's perf_model.csv: per (GPU, TP, P, B, T),
    the mean prompt_time (TTFT) and token_time (TPOT) of the file's repetitions."""
    df = pd.read_csv(path)
    df = df[(df.model == "llama2-70b") & df.hardware.isin(list(SPLITWISE_GPUS))]
    keys = ["hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"]
    rows = []
    for (hw, tp, isl, batch, osl), g in df.groupby(keys, sort=True):
        for metric, column in (("ttft", "prompt_time"), ("tpot", "token_time")):
            rows.append([
                "splitwise_perf_model", SPLITWISE_URL,
                "not stated (Splitwise's characterization; data file committed 2024-03-29)",
                SPLITWISE_GPUS[hw], 8, int(tp), "meta-llama/Llama-2-70b-hf", "fp16", "fp16",
                SPLITWISE_WORKLOAD, int(isl), int(osl), int(batch), "", int(batch), metric,
                f"mean of {len(g)} runs", round(float(g[column].mean()), 3), "ms",
                f"mean of the file's {len(g)} rows for this configuration (computed)",
                SPLITWISE_NOTE])
    return rows


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit(f"usage: python bench/data/build_validation.py PATH/TO/perf_model.csv "
                         f"(from {SPLITWISE_URL})")
    rows = [list(m) for m in MANUAL] + silicon_rows() + splitwise_rows(Path(argv[0]))
    with OUT.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for i, r in enumerate(rows, 1):
            w.writerow([i, *r])
    df = pd.read_csv(OUT)
    print(len(df), "rows")
    print(df.groupby(["source_id", "gpu", "weight_dtype"]).size().to_string())


if __name__ == "__main__":
    main(sys.argv[1:])
