//! What a position's label names: its split and its stratum, a domain's
//! text tokens or that domain's image positions. Labels stay one small
//! integer pair on the hot path (the observer, the device reductions and the
//! chunk scratch group by them); [`Strata`] alone maps them to the group
//! keys of the statistics.

use numbers::stats::GroupKey;
use numbers::{Modality, Split};

/// The strata of a corpus's domains: stratum `d` is domain `d`'s text,
/// stratum `n + d` its images (`n` domains).
#[derive(Clone, Debug)]
pub struct Strata {
    domains: Vec<String>,
}

impl Strata {
    /// The strata of `domains`; refused when their image strata would not
    /// fit a label.
    pub fn new(domains: Vec<String>) -> Result<Strata, String> {
        if domains.len() > usize::from(u16::MAX) / 2 {
            return Err(format!(
                "{} domains: at most {} can be measured with their images",
                domains.len(),
                u16::MAX / 2
            ));
        }
        Ok(Strata { domains })
    }

    /// The stratum of domain `domain`'s positions of `modality`.
    pub fn stratum(&self, domain: u16, modality: Modality) -> u16 {
        match modality {
            Modality::Text => domain,
            Modality::Image => domain + self.domains.len() as u16,
        }
    }

    /// The domain name of `stratum`.
    pub fn domain(&self, stratum: u16) -> &str {
        &self.domains[usize::from(stratum) % self.domains.len()]
    }

    /// The statistics group of the positions labelled `(split, stratum)`.
    pub fn key(&self, split: Split, stratum: u16) -> GroupKey {
        let modality = match usize::from(stratum) < self.domains.len() {
            true => Modality::Text,
            false => Modality::Image,
        };
        GroupKey {
            split,
            domain: self.domain(stratum).to_string(),
            modality,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_domain_has_a_text_and_an_image_stratum() {
        let s = Strata::new(vec!["en".into(), "ja".into()]).unwrap();
        assert_eq!(s.stratum(1, Modality::Text), 1);
        assert_eq!(s.stratum(1, Modality::Image), 3);
        assert_eq!(s.domain(3), "ja");
        assert_eq!(s.key(Split::Fit, 1), GroupKey::text(Split::Fit, "ja"));
        let image = s.key(Split::Heldout, 2);
        assert_eq!(
            (image.domain.as_str(), image.modality),
            ("en", Modality::Image)
        );
        assert!(Strata::new(vec![String::new(); 40_000]).is_err());
    }
}
