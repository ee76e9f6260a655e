//! The SLO and goodput flags, shared by `pace serve`, `pace bench` and `pace sim` so that one
//! command line means the same thing to all three. One unit per quantity: every time a user
//! types is in milliseconds (`--slo` thresholds, `--ttft-grace`) except the penalty's cap, which
//! is in seconds of idle latency as the metric itself is; the reading rate is in tokens per
//! second.

use crate::slo::{BinarySlo, ParseError, Penalty, SloClass, SloParams};
use clap::Args;

/// `--slo` (alias `--goodput`), `--reading-rate`, `--ttft-grace`, `--alpha`, `--penalty`.
#[derive(Debug, Clone, Args)]
pub struct SloArgs {
    /// Binary SLO, milliseconds, vLLM's `--goodput` syntax: `ttft:MS tpot:MS e2el:MS`, any
    /// subset, as one word or several. Default: pace serve `ttft:2000 tpot:100`; pace bench
    /// none (no binary goodput); pace sim the preset's.
    #[arg(long = "slo", visible_alias = "goodput", num_args = 1.., value_name = "KEY:MS", env = "PACE_SLO")]
    pub slo: Vec<String>,
    /// Reading rate q of users, tokens per second (smooth goodput; smooth's default class).
    #[arg(long, default_value_t = 5.0, value_parser = positive, env = "PACE_READING_RATE")]
    pub reading_rate: f64,
    /// First-token grace g, milliseconds: token i is due at arrival + g + i/q.
    #[arg(long, default_value_t = 0.0, value_name = "MS", value_parser = non_negative, env = "PACE_TTFT_GRACE")]
    pub ttft_grace: f64,
    /// Weight alpha of waiting against output in the benefit n - alpha f(idle).
    #[arg(long, default_value_t = 2.5, value_parser = non_negative, env = "PACE_ALPHA")]
    pub alpha: f64,
    /// Penalty f of idle seconds: linear, quadratic or capped:SECONDS.
    #[arg(long, default_value = "linear", value_parser = parse_penalty, env = "PACE_PENALTY")]
    pub penalty: Penalty,
}

impl SloArgs {
    /// The binary SLO given, or `None` when `--slo` was not.
    pub fn binary(&self) -> Result<Option<BinarySlo>, ParseError> {
        if self.slo.is_empty() {
            return Ok(None);
        }
        let joined = self.slo.join(" ");
        joined.parse::<BinarySlo>().map(Some).map_err(|e| ParseError(format!("--slo '{joined}': {e}")))
    }

    /// The default reading class: rate q, grace g (in seconds, as the metrics keep it).
    pub fn class(&self) -> SloClass {
        SloClass::new(self.reading_rate, self.ttft_grace / 1e3)
    }

    /// Everything the goodput metrics need, with `binary` as the SLO (`binary()` or a default).
    pub fn params(&self, binary: BinarySlo) -> SloParams {
        SloParams { alpha: self.alpha, penalty: self.penalty, binary, default_class: self.class() }
    }
}

fn parse_penalty(s: &str) -> Result<Penalty, String> {
    s.parse::<Penalty>().map_err(|e| e.to_string())
}

/// A clap value parser: a finite number > 0.
pub fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("'{s}' must be a positive number")),
    }
}

/// A clap value parser: a finite number >= 0.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("'{s}' must be a number >= 0")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::SloArgs;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        slo: SloArgs,
    }

    #[test]
    fn one_spelling_and_one_unit() {
        let a = Cli::try_parse_from(["x", "--goodput", "ttft:500", "tpot:50", "--ttft-grace", "250", "--penalty", "capped:5"]).unwrap().slo;
        let b = Cli::try_parse_from(["x", "--slo", "ttft:500 tpot:50", "--ttft-grace=250", "--penalty=capped:5"]).unwrap().slo;
        for s in [&a, &b] {
            let slo = s.binary().unwrap().unwrap();
            assert_eq!((slo.ttft, slo.tpot, slo.e2el), (Some(0.5), Some(0.05), None), "thresholds are milliseconds");
            assert_eq!(s.class().grace, 0.25, "the grace is milliseconds");
            assert_eq!(s.penalty.to_string(), "capped:5");
        }
        let none = Cli::try_parse_from(["x"]).unwrap().slo;
        assert!(none.binary().unwrap().is_none());
        assert_eq!((none.reading_rate, none.alpha, none.ttft_grace), (5.0, 2.5, 0.0));
        assert!(Cli::try_parse_from(["x", "--reading-rate", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--penalty", "cubic"]).is_err());
        assert!(Cli::try_parse_from(["x", "--slo", "ttft:soon"]).unwrap().slo.binary().is_err());
    }
}
