import sys

if sys.argv[1:2] == ["scale"]:  # python -m bench scale ...: bench/resume_scale.py
    from bench.resume_scale import main
    sys.exit(main(sys.argv[2:]))

from bench.run import main

sys.exit(main())
