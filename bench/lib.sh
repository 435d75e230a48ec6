# Helpers the bench scripts share (sourced). Rounds alternate the sides of a comparison and each
# side is reported as the median of its rounds: the host's speed drifts within minutes.

# The median of the numbers on stdin, one per line (the mean of the middle two for an even count).
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

# a / b to two decimals (0 when b is not positive: a side that measured nothing).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
