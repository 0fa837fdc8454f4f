//! What an API server's answer to a failed request means, decided in one place: a stable
//! reason (a log field, a metric label) and whether the same request may go through soon
//! (the server was away or overloaded) or was refused and will be refused again.

/// The kind of a failed request's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiAnswer {
    /// Someone else wrote first (409).
    Conflict,
    /// The object is gone (404).
    NotFound,
    /// RBAC or an admission policy said no (403).
    Forbidden,
    /// The request was malformed or failed validation (400, 422).
    Invalid,
    /// The server was away or overloaded: 429, 5xx, no connection, a timeout.
    Unavailable,
    /// Anything else (a reply that could not be read, ...).
    Other,
}

impl ApiAnswer {
    /// The answer `e` carries.
    pub fn of(e: &kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => match s.code {
                409 => ApiAnswer::Conflict,
                404 => ApiAnswer::NotFound,
                403 => ApiAnswer::Forbidden,
                400 | 422 => ApiAnswer::Invalid,
                429 | 500..=599 => ApiAnswer::Unavailable,
                _ => ApiAnswer::Other,
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) => ApiAnswer::Unavailable,
            _ => ApiAnswer::Other,
        }
    }

    /// The stable, CamelCase name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiAnswer::Conflict => "Conflict",
            ApiAnswer::NotFound => "NotFound",
            ApiAnswer::Forbidden => "Forbidden",
            ApiAnswer::Invalid => "Invalid",
            ApiAnswer::Unavailable => "Unavailable",
            ApiAnswer::Other => "Other",
        }
    }

    /// Whether the same request may go through once the server recovers.
    pub fn passes(self) -> bool {
        self == ApiAnswer::Unavailable
    }
}

/// A failed request's error with HTTP status `code`, for tests.
#[cfg(test)]
pub fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("m", "r")
            .with_code(code)
            .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overloaded_or_absent_server_passes_and_a_refusal_does_not() {
        for (code, answer) in [
            (409, ApiAnswer::Conflict),
            (404, ApiAnswer::NotFound),
            (403, ApiAnswer::Forbidden),
            (422, ApiAnswer::Invalid),
            (400, ApiAnswer::Invalid),
            (429, ApiAnswer::Unavailable),
            (503, ApiAnswer::Unavailable),
            (504, ApiAnswer::Unavailable),
            (418, ApiAnswer::Other),
        ] {
            assert_eq!(ApiAnswer::of(&api_error(code)), answer, "{code}");
            assert_eq!(answer.passes(), code == 429 || code >= 500, "{code}");
        }
        let no_connection = kube::Error::Service("connection refused".into());
        assert_eq!(ApiAnswer::of(&no_connection), ApiAnswer::Unavailable);
    }
}
