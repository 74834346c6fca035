"""The mutation-testing tool behind `make mutate` (docs/mutation.md), split at its seams:
config (ROOT, tools/mutate.toml, a mutant), mutants (which ones a run makes), server (the
scratch trees and the test server), testmap (the coverage map), scheduler (the tests of
each mutant, run in a free server), outcomes (the report, the history, the killers file).
Run it as the script tools/mutate.py, which puts tools/ on sys.path."""
