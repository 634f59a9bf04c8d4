"""Start-up time of `sdcloud --help` and the time of `sdcloud offers` over the whole catalog.

Anchors in the same run: the bare interpreter (`python -c pass`, the floor) and the start-up of
the AWS CLI (`aws --version`, a peer CLI on boto3, when installed).

    python bench/startup.py [--repeat 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def timed(cmd: list[str], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="a quick form for the test suite: each command once")
    args = parser.parse_args()
    if args.smoke:
        args.repeat = 1
    py = sys.executable
    sdcloud = [py, "-m", "sdcloud.cli"]
    floor = timed([py, "-c", "pass"], args.repeat)
    help_s = timed(sdcloud + ["--help"], args.repeat)
    tiers = ["sd15-lora", "sdxl-lora", "sdxl-finetune", "batch-sdxl"]
    offers = statistics.median(timed(sdcloud + ["offers", "--tier", t, "--json", "--limit", "0"], max(1, args.repeat // 2))
                               for t in tiers)
    aws = shutil.which("aws")
    aws_s = timed([aws, "--version"], args.repeat) if aws else float("nan")
    print(f"python -c pass          {floor * 1000:8.1f} ms  (interpreter floor)")
    print(f"sdcloud --help          {help_s * 1000:8.1f} ms")
    print(f"sdcloud offers (all)    {offers * 1000:8.1f} ms  (whole catalog, both markets, JSON)")
    print(f"aws --version           {aws_s * 1000:8.1f} ms  (peer CLI anchor)")
    print(f"startup help_ms={help_s * 1000:.1f} offers_ms={offers * 1000:.1f} "
          f"python_ms={floor * 1000:.1f} awscli_ms={aws_s * 1000:.1f}")


if __name__ == "__main__":
    main()
