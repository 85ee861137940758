import sys

if sys.argv[1:2] == ["scale"]:  # python -m bench scale ...: bench/resume_scale.py
    from bench.resume_scale import main
    sys.exit(main(sys.argv[2:]))

if sys.argv[1:2] == ["prefix"]:  # python -m bench prefix ...: bench/prefix_affinity.py
    from bench.prefix_affinity import main
    sys.exit(main(sys.argv[2:]))

from bench.run import main

sys.exit(main())
