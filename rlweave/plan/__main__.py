import sys

from rlweave.plan.command import main

sys.exit(main(sys.argv[1:]))
