"""Reports over finished runs: tables, figures, Welch tests, outcome labels and the HTML pages."""
