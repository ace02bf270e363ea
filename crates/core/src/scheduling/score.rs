//! Score arithmetic shared by the scheduler and the scorers.

/// GIE clamps every score to [0, 1]; a NaN from a broken scorer counts as 0.
pub fn clamp_score(score: f64) -> f64 {
    if score.is_nan() {
        0.0
    } else {
        score.clamp(0.0, 1.0)
    }
}

/// Min-max normalisation shared by the queue and running-requests scorers:
/// `(max - v) / (max - min)` over the known values, 1.0 for everyone when they are all equal.
/// An unknown value (`None`, or not finite) scores 0, the worst, and is left out of the
/// range, so it cannot change how the others compare.
pub fn score_lower_is_better(
    values: impl Iterator<Item = Option<f64>> + Clone,
    scores: &mut [f64],
) {
    let known = |value: Option<f64>| value.filter(|v| v.is_finite());
    let (min, max) = values
        .clone()
        .filter_map(known)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    // Finite values can still be too far apart to subtract (-1e308 and 1e308).
    let range = max - min;
    for (score, value) in scores.iter_mut().zip(values) {
        *score = match known(value) {
            None => 0.0,
            Some(_) if range <= 0.0 => 1.0,
            Some(v) if range.is_finite() => (max - v) / range,
            // Halve everything first: the same order, and no overflow.
            Some(v) => (max / 2.0 - v / 2.0) / (max / 2.0 - min / 2.0),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::test;

    #[test]
    fn clamping() {
        assert_eq!(clamp_score(f64::NAN), 0.0);
        assert_eq!(clamp_score(1.5), 1.0);
        assert_eq!(clamp_score(-0.5), 0.0);
        assert_eq!(clamp_score(0.25), 0.25);
    }

    #[test]
    fn lower_is_better_normalisation() {
        let mut scores = [0.0; 3];
        score_lower_is_better([Some(0.0), Some(5.0), Some(10.0)].into_iter(), &mut scores);
        assert_eq!(scores, [1.0, 0.5, 0.0]);
        score_lower_is_better([Some(3.0), Some(3.0), Some(3.0)].into_iter(), &mut scores);
        assert_eq!(scores, [1.0, 1.0, 1.0]);
    }

    #[test]
    fn unknown_values_score_worst_and_leave_the_range_alone() {
        let mut scores = [0.0; 4];
        for unknown in [
            None,
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(f64::NEG_INFINITY),
        ] {
            score_lower_is_better(
                [Some(0.0), unknown, Some(5.0), Some(10.0)].into_iter(),
                &mut scores,
            );
            assert_eq!(scores, [1.0, 0.0, 0.5, 0.0], "{unknown:?}");
        }
        score_lower_is_better([None, Some(4.0), None, Some(4.0)].into_iter(), &mut scores);
        assert_eq!(scores, [0.0, 1.0, 0.0, 1.0]);
        let mut scores = [0.0; 3];
        score_lower_is_better(
            [Some(-1e308), Some(0.0), Some(1e308)].into_iter(),
            &mut scores,
        );
        assert_eq!(scores, [1.0, 0.5, 0.0], "a range too wide to subtract");
    }
}
