//! Text for language models: a file turned into tokens (its bytes, vocabulary 256, or its
//! characters), split into training and validation parts, and random windows of `block + 1`
//! tokens drawn from a small seeded generator ([`WindowRng`], SplitMix64, which
//! `benches/torch_gpt.py` implements too, so both draw the same batches).

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// How text becomes tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Vocab {
    /// Each byte is a token (256 of them): every file works.
    Bytes,
    /// Each distinct character of the training file is a token, in sorted order.
    Chars(Vec<char>),
}

impl Vocab {
    /// Tokens in the vocabulary.
    pub fn len(&self) -> usize {
        match self {
            Vocab::Bytes => 256,
            Vocab::Chars(c) => c.len(),
        }
    }
    /// Whether it is empty (a char vocabulary of no text).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Token ids of `text`; a character outside a char vocabulary is an error naming it.
    pub fn encode(&self, text: &str) -> Result<Vec<usize>> {
        match self {
            Vocab::Bytes => Ok(text.bytes().map(usize::from).collect()),
            Vocab::Chars(chars) => {
                let index: HashMap<char, usize> = chars.iter().enumerate().map(|(i, &c)| (c, i)).collect();
                text.chars()
                    .map(|c| {
                        index.get(&c).copied().ok_or_else(|| Error::InvalidSetting {
                            setting: "--prompt",
                            value: format!("{c:?}"),
                            allowed: format!(
                                "characters of the model's vocabulary of {} (the training text's): {:?}",
                                chars.len(),
                                chars.iter().collect::<String>()
                            ),
                        })
                    })
                    .collect()
            }
        }
    }

    /// The text of `ids` (bytes that are not UTF-8 are replaced by U+FFFD).
    pub fn decode(&self, ids: &[usize]) -> String {
        match self {
            Vocab::Bytes => String::from_utf8_lossy(&ids.iter().map(|&i| i as u8).collect::<Vec<_>>()).into_owned(),
            Vocab::Chars(chars) => ids.iter().map(|&i| chars.get(i).copied().unwrap_or('\u{fffd}')).collect(),
        }
    }

    /// Checkpoint metadata: `gpt.tokens` (`bytes` or `chars`) and, for chars, `gpt.chars`.
    pub fn to_metadata(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        match self {
            Vocab::Bytes => {
                m.insert("gpt.tokens".into(), "bytes".into());
            }
            Vocab::Chars(c) => {
                m.insert("gpt.tokens".into(), "chars".into());
                m.insert("gpt.chars".into(), c.iter().collect());
            }
        }
        m
    }

    /// Reads [`Vocab::to_metadata`]'s keys back.
    pub fn from_metadata(meta: &HashMap<String, String>) -> Result<Vocab> {
        match meta.get("gpt.tokens").map(String::as_str) {
            Some("bytes") => Ok(Vocab::Bytes),
            Some("chars") => {
                let c = meta.get("gpt.chars").ok_or_else(|| Error::InvalidSetting {
                    setting: "--checkpoint",
                    value: "a char-token checkpoint without `gpt.chars`".into(),
                    allowed: "a checkpoint written by `kiln train --model gpt`".into(),
                })?;
                Ok(Vocab::Chars(c.chars().collect()))
            }
            other => Err(Error::InvalidSetting {
                setting: "--checkpoint",
                value: format!("tokens {other:?}"),
                allowed: "a checkpoint written by `kiln train --model gpt` (tokens `bytes` or `chars`)".into(),
            }),
        }
    }
}

/// Which vocabulary `--tokens` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// Bytes (vocabulary 256).
    Bytes,
    /// The file's characters.
    Chars,
}

/// A tokenized text split into training and validation parts (the first 90% and the last 10%).
#[derive(Clone, Debug)]
pub struct Corpus {
    /// The vocabulary.
    pub vocab: Vocab,
    /// Training tokens.
    pub train: Vec<usize>,
    /// Validation tokens.
    pub val: Vec<usize>,
}

/// The fraction of the tokens used for training (the rest validates).
pub const TRAIN_FRACTION: f64 = 0.9;

fn data_err(path: &str, msg: impl Into<String>) -> Error {
    Error::InvalidSetting { setting: "--data", value: path.to_string(), allowed: msg.into() }
}

impl Corpus {
    /// Reads and tokenizes `path` for windows of `block + 1` tokens (both parts must hold one).
    pub fn from_file(path: &Path, kind: TokenKind, block: usize) -> Result<Corpus> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| data_err(&name, format!("a readable file ({e})")))?;
        Corpus::from_bytes(&bytes, kind, block, &name)
    }

    /// [`Corpus::from_file`] of bytes in memory (`name` for messages).
    pub fn from_bytes(bytes: &[u8], kind: TokenKind, block: usize, name: &str) -> Result<Corpus> {
        if bytes.is_empty() {
            return Err(data_err(name, "a non-empty text file (this one is empty)"));
        }
        let (vocab, tokens) = match kind {
            TokenKind::Bytes => (Vocab::Bytes, bytes.iter().map(|&b| usize::from(b)).collect::<Vec<_>>()),
            TokenKind::Chars => {
                let text = std::str::from_utf8(bytes).map_err(|e| {
                    data_err(
                        name,
                        format!(
                            "UTF-8 text for `--tokens chars` (byte {} is not: {e}); use `--tokens bytes` for any file",
                            e.valid_up_to()
                        ),
                    )
                })?;
                let mut chars: Vec<char> = text.chars().collect();
                chars.sort_unstable();
                chars.dedup();
                let vocab = Vocab::Chars(chars);
                let tokens = vocab.encode(text)?;
                (vocab, tokens)
            }
        };
        let n_train = ((tokens.len() as f64) * TRAIN_FRACTION) as usize;
        let need = block + 1;
        if n_train < need || tokens.len() - n_train < need {
            return Err(data_err(
                name,
                format!(
                    "a text of at least {} tokens for block {block} (it has {}: 90% trains and 10% validates, \
                     each part needs a window of {need}); use a longer file or a smaller --block",
                    (need as f64 / (1.0 - TRAIN_FRACTION)).ceil() as usize + 1,
                    tokens.len()
                ),
            ));
        }
        let val = tokens[n_train..].to_vec();
        let mut train = tokens;
        train.truncate(n_train);
        Ok(Corpus { vocab, train, val })
    }
}

/// SplitMix64: a tiny seeded generator that Python reproduces exactly (`benches/torch_gpt.py`).
#[derive(Clone, Debug)]
pub struct WindowRng {
    state: u64,
}

impl WindowRng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> WindowRng {
        WindowRng { state: seed }
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A generator continuing from [`WindowRng::state`].
    pub fn from_state(state: u64) -> WindowRng {
        WindowRng { state }
    }
    /// The generator's state (saved in checkpoints, so a resumed run draws the windows the
    /// uninterrupted run would have).
    pub fn state(&self) -> u64 {
        self.state
    }
}

/// `batch` windows of `tokens`, each `block` inputs and the `block` targets one position later,
/// the start of each `next_u64() % (len - block)`: (inputs, targets), row-major `[batch, block]`.
pub fn windows(tokens: &[usize], batch: usize, block: usize, rng: &mut WindowRng) -> (Vec<usize>, Vec<usize>) {
    let span = (tokens.len() - block) as u64;
    let mut x = Vec::with_capacity(batch * block);
    let mut y = Vec::with_capacity(batch * block);
    for _ in 0..batch {
        let s = (rng.next_u64() % span) as usize;
        x.extend_from_slice(&tokens[s..s + block]);
        y.extend_from_slice(&tokens[s + 1..s + block + 1]);
    }
    (x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_chars() {
        let text = "hello world, hello kiln. ".repeat(4);
        let c = Corpus::from_bytes(text.as_bytes(), TokenKind::Bytes, 8, "t").unwrap();
        assert_eq!(c.vocab.len(), 256);
        assert_eq!(c.train.len() + c.val.len(), text.len());
        let c = Corpus::from_bytes(text.as_bytes(), TokenKind::Chars, 8, "t").unwrap();
        assert_eq!(c.vocab.decode(&c.vocab.encode("hello").unwrap()), "hello");
        assert!(c.vocab.encode("Z").unwrap_err().to_string().contains("'Z'"));
        assert_eq!(Vocab::from_metadata(&c.vocab.to_metadata()).unwrap(), c.vocab);
    }

    #[test]
    fn errors() {
        assert!(Corpus::from_bytes(b"", TokenKind::Bytes, 8, "t").unwrap_err().to_string().contains("empty"));
        assert!(Corpus::from_bytes(b"short", TokenKind::Bytes, 8, "t").unwrap_err().to_string().contains("--block"));
        let bad = [0xffu8; 100];
        assert!(Corpus::from_bytes(&bad, TokenKind::Chars, 8, "t").unwrap_err().to_string().contains("UTF-8"));
        assert!(Corpus::from_bytes(&bad, TokenKind::Bytes, 8, "t").is_ok());
    }

    #[test]
    fn splitmix_and_windows() {
        // SplitMix64 from seed 0: the reference's first output.
        assert_eq!(WindowRng::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
        let tokens: Vec<usize> = (0..50).collect();
        let (x, y) = windows(&tokens, 3, 5, &mut WindowRng::new(7));
        assert_eq!(x.len(), 15);
        for (a, b) in x.iter().zip(&y) {
            assert_eq!(a + 1, *b);
        }
    }
}
