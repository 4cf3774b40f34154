"""What a check hands on, without torch: the results every rule produces and every reporter reads
(findings, artifact figures, fix and remedy summaries, input errors, the run's report) and a
finding's place in the user's model source, so both tiers say it the same way."""
