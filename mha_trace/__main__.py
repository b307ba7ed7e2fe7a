from mha_trace.cli import main

main()
