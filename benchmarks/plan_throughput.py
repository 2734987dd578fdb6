"""Query-plan throughput benchmark (see adaptive_lb/tools/bench.py).

python benchmarks/plan_throughput.py
"""

import sys

from adaptive_lb.tools.bench import main

if __name__ == "__main__":
    sys.exit(main(prog="python benchmarks/plan_throughput.py"))
