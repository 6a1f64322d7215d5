"""Ready scenario files (package data): ``fedsim run quickstart`` finds them from any folder."""
