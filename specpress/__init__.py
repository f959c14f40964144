"""specpress: compress and export speculative-decoding drafters, and measure what it costs in acceptance.

Importing the package is cheap (no torch); the heavy modules load when a verb runs.
"""

__version__ = "0.1.0"
