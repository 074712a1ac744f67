//! What `xtask` does besides the release artifacts: the book's generated CLI reference and the
//! check of the book's links (see `main.rs` for the commands).

pub mod cli_docs;
pub mod doc_links;
