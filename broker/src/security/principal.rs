//! The principal of a client that shows a certificate on an `SSL` listener, as Kafka's
//! `DefaultKafkaPrincipalBuilder` makes it: the certificate's subject written as Java's
//! `X500Principal.getName()` writes it (RFC 2253: the last attribute first, `CN=alice,OU=tests`
//! for a subject made as `/OU=tests/CN=alice`), passed through `ssl.principal.mapping.rules`
//! (Kafka's `SslPrincipalMapper`), then `User:<name>`. A client without a certificate is
//! `User:ANONYMOUS`.

use regex::Regex;
use x509_parser::der_parser::asn1_rs::ToDer;

/// `ssl.principal.mapping.rules`: `DEFAULT`, or `RULE:pattern/replacement/[LU]` entries tried in
/// order, separated by commas.
#[derive(Clone, Debug)]
pub struct PrincipalMapper {
    rules: Vec<Rule>,
}

#[derive(Clone, Debug)]
enum Rule {
    Default,
    Replace {
        /// The pattern, to match the whole name.
        whole: Regex,
        /// The pattern as written, for the replacement.
        pattern: Regex,
        /// The replacement in the regex crate's syntax (`${1}` for Java's `$1`).
        replacement: String,
        case: Case,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

impl Default for PrincipalMapper {
    fn default() -> Self {
        PrincipalMapper {
            rules: vec![Rule::Default],
        }
    }
}

impl PrincipalMapper {
    /// Parses the rules as Kafka does; an error names the rule that is wrong.
    pub fn parse(text: &str) -> Result<PrincipalMapper, String> {
        let mut rules = Vec::new();
        let mut rest = text.trim_start();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("DEFAULT") {
                rules.push(Rule::Default);
                rest = after;
            } else if let Some(after) = rest.strip_prefix("RULE:") {
                let (pattern, after) = until_slash(after).ok_or_else(|| {
                    format!("invalid rule {rest:?}: RULE:pattern/replacement/[LU]")
                })?;
                let (replacement, after) = until_slash(after).ok_or_else(|| {
                    format!("invalid rule {rest:?}: RULE:pattern/replacement/[LU]")
                })?;
                let (case, after) = match after.chars().next() {
                    Some('L') => (Case::Lower, &after[1..]),
                    Some('U') => (Case::Upper, &after[1..]),
                    _ => (Case::Keep, after),
                };
                let bad = |e: regex::Error| format!("invalid rule pattern {pattern:?}: {e}");
                rules.push(Rule::Replace {
                    whole: Regex::new(&format!("^(?:{pattern})$")).map_err(bad)?,
                    pattern: Regex::new(&pattern).map_err(bad)?,
                    replacement: java_replacement(&replacement),
                    case,
                });
                rest = after;
            } else {
                return Err(format!(
                    "invalid rule {rest:?}: each rule is DEFAULT or RULE:pattern/replacement/[LU]"
                ));
            }
            // Anything up to the next comma is ignored, as Kafka's parser does.
            rest = match rest.find(',') {
                Some(i) => rest[i + 1..].trim_start(),
                None if rest.trim().is_empty() => "",
                None => return Err(format!("invalid rule: {rest:?} after a rule")),
            };
        }
        if rules.is_empty() {
            return Err("no rule: set DEFAULT, or RULE:pattern/replacement/[LU] entries".into());
        }
        Ok(PrincipalMapper { rules })
    }

    /// The name the first rule that applies makes of `dn`; an error when none applies.
    pub fn name(&self, dn: &str) -> Result<String, String> {
        for rule in &self.rules {
            match rule {
                Rule::Default => return Ok(dn.to_string()),
                Rule::Replace {
                    whole,
                    pattern,
                    replacement,
                    case,
                } => {
                    if !whole.is_match(dn) {
                        continue;
                    }
                    let name = pattern.replace_all(dn, replacement.as_str()).into_owned();
                    return Ok(match case {
                        Case::Keep => name,
                        Case::Lower => name.to_lowercase(),
                        Case::Upper => name.to_uppercase(),
                    });
                }
            }
        }
        Err(format!(
            "no rule of ssl.principal.mapping.rules applies to {dn}"
        ))
    }
}

/// Up to the next `/` not escaped as `\/` (which stands for `/`), and what follows it.
fn until_slash(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '/' => return Some((out, &s[i + 1..])),
            '\\' if s[i + 1..].starts_with('/') => {
                out.push('/');
                chars.next();
            }
            c => out.push(c),
        }
    }
    None
}

/// Java's replacement syntax (`$1`, `\$` for a dollar) in the regex crate's (`${1}`, `$$`).
fn java_replacement(java: &str) -> String {
    let mut out = String::new();
    let mut chars = java.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => out.push_str("$$"),
                Some(c) => out.push(c),
                None => {}
            },
            '$' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                if digits.is_empty() {
                    out.push_str("$$");
                } else {
                    out.push_str(&format!("${{{digits}}}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// The subject of the DER certificate `der` as Java's `X500Principal.getName()` writes it.
pub fn subject_name(der: &[u8]) -> Result<String, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("the client's certificate does not parse: {e}"))?;
    let mut rdns = Vec::new();
    for rdn in cert.subject().iter() {
        let mut parts = Vec::new();
        for attr in rdn.iter() {
            let oid = attr.attr_type().to_id_string();
            let keyword = match oid.as_str() {
                "2.5.4.3" => Some("CN"),
                "2.5.4.6" => Some("C"),
                "2.5.4.7" => Some("L"),
                "2.5.4.8" => Some("ST"),
                "2.5.4.9" => Some("STREET"),
                "2.5.4.10" => Some("O"),
                "2.5.4.11" => Some("OU"),
                "0.9.2342.19200300.100.1.1" => Some("UID"),
                "0.9.2342.19200300.100.1.25" => Some("DC"),
                _ => None,
            };
            let part = match (keyword, attr.as_str()) {
                (Some(keyword), Ok(value)) => format!("{keyword}={}", escape(value)),
                // Attributes without a keyword, and values that are not strings, go as the
                // hex of their DER encoding, as Java writes them.
                (keyword, _) => {
                    let der = attr
                        .attr_value()
                        .to_der_vec()
                        .map_err(|e| format!("the client's certificate subject: {e}"))?;
                    let hex: String = der.iter().map(|b| format!("{b:02x}")).collect();
                    format!("{}=#{hex}", keyword.map_or(oid.clone(), str::to_string))
                }
            };
            parts.push(part);
        }
        rdns.push(parts.join("+"));
    }
    rdns.reverse();
    Ok(rdns.join(","))
}

/// RFC 2253's escapes: `,+"\<>;` anywhere, `#` and a space first, a space last.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == '#' || c == ' '))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keeps_the_name() {
        let m = PrincipalMapper::default();
        assert_eq!(m.name("CN=alice,OU=tests").unwrap(), "CN=alice,OU=tests");
    }

    #[test]
    fn rules_apply_in_order_as_kafkas_mapper_applies_them() {
        // Examples of Kafka's documentation of ssl.principal.mapping.rules.
        let m = PrincipalMapper::parse(
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,DEFAULT",
        )
        .unwrap();
        assert_eq!(
            m.name("CN=kafka-monitoring,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown")
                .unwrap(),
            "kafka-monitoring"
        );
        assert_eq!(
            m.name("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Cupertino,ST=CA,C=US")
                .unwrap(),
            "duke@javasoft"
        );
        assert_eq!(m.name("OU=X,cn=Some.Host").unwrap(), "some.host");
        assert_eq!(m.name("O=none").unwrap(), "O=none");
        let upper = PrincipalMapper::parse("RULE:^CN=([^,]*).*$/$1/U").unwrap();
        assert_eq!(upper.name("CN=alice,OU=tests").unwrap(), "ALICE");
        assert!(upper.name("OU=tests").is_err(), "no rule applies: refused");
        // An escaped slash in a pattern or a replacement.
        let slash = PrincipalMapper::parse(r"RULE:^CN=(.*)\/(.*)$/$1\/$2/").unwrap();
        assert_eq!(slash.name("CN=a/b").unwrap(), "a/b");
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in ["", "RULE:abc", "RULE:^(/x/,", "NOPE", "DEFAULT x"] {
            assert!(PrincipalMapper::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_are_escaped_as_rfc_2253_asks() {
        assert_eq!(escape("a,b+c"), r"a\,b\+c");
        assert_eq!(escape("#x "), r"\#x\ ");
        assert_eq!(escape(" lead"), r"\ lead");
    }
}
