"""Pure tests: no processes, no py-spy, no network; the whole set runs in seconds."""
