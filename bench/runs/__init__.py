"""The main benchmark, `python bench/run.py` (`make bench`), split at its seams: common (the
queries, the relations' columns, the settings shared by the parent and its measurement
processes, reading peak memory), measurements (`one`: each measurement, run in a process
of its own), suite (one size's inputs, its measurements in order, the tables printed).
bench/run.py parses the arguments; run as a script, it puts bench/ on sys.path."""
