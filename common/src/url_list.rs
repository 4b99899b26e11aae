//! Lists of addresses given as one flag (`--coordinator URL1,URL2`: a leader and its
//! standbys), so every role reads them alike.

/// The URLs of a comma-separated list, trimmed, empty items dropped.
pub fn url_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_split_trimmed_and_empty_items_dropped() {
        assert_eq!(
            url_list("http://a:1, http://b:2,,"),
            vec!["http://a:1", "http://b:2"]
        );
        assert_eq!(url_list("http://a:1"), vec!["http://a:1"]);
        assert!(url_list(" , ").is_empty());
    }
}
