//! A small JSON reader for module configs (no dependencies): `parse`
//! gives a [`Value`] tree; object fields are looked up the way Go's
//! encoding/json fills a struct (the last key that matches, ignoring ASCII
//! case), so a Rust module reads the same config as its Go twin.

/// A JSON value. Numbers keep their text.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

impl Value {
    /// The field of an object whose key equals name ignoring ASCII case
    /// (the last such key); None for a missing field, a null, or a value
    /// that is not an object.
    pub fn field(&self, name: &str) -> Option<&Value> {
        match self {
            Value::Object(kvs) => kvs
                .iter()
                .rev()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
                .filter(|v| **v != Value::Null),
            _ => None,
        }
    }
    /// An integer without fraction or exponent that fits i64.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Number(s) if !s.contains(['.', 'e', 'E']) => s.parse().ok(),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Parses one JSON value; nothing but whitespace may follow it.
pub fn parse(b: &[u8]) -> Result<Value, &'static str> {
    let mut p = Parser { b, p: 0, depth: 0 };
    let v = p.value()?;
    p.ws();
    if p.p != b.len() {
        return Err("json: trailing data");
    }
    Ok(v)
}

struct Parser<'a> {
    b: &'a [u8],
    p: usize,
    depth: u32,
}

impl<'a> Parser<'a> {
    fn ws(&mut self) {
        while self.p < self.b.len() && matches!(self.b[self.p], b' ' | b'\t' | b'\n' | b'\r') {
            self.p += 1;
        }
    }
    fn peek(&self) -> Option<u8> {
        self.b.get(self.p).copied()
    }
    fn lit(&mut self, s: &[u8], v: Value) -> Result<Value, &'static str> {
        if self.b[self.p..].starts_with(s) {
            self.p += s.len();
            Ok(v)
        } else {
            Err("json: invalid literal")
        }
    }
    fn value(&mut self) -> Result<Value, &'static str> {
        self.ws();
        match self.peek() {
            Some(b'{') => self.nested(|p| p.object()),
            Some(b'[') => self.nested(|p| p.array()),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.lit(b"true", Value::Bool(true)),
            Some(b'f') => self.lit(b"false", Value::Bool(false)),
            Some(b'n') => self.lit(b"null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err("json: unexpected input"),
        }
    }
    fn nested(&mut self, f: fn(&mut Self) -> Result<Value, &'static str>) -> Result<Value, &'static str> {
        self.depth += 1;
        if self.depth > 64 {
            return Err("json: nested too deep");
        }
        let v = f(self);
        self.depth -= 1;
        v
    }
    fn object(&mut self) -> Result<Value, &'static str> {
        self.p += 1;
        let mut kvs = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.p += 1;
            return Ok(Value::Object(kvs));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err("json: object key is not a string");
            }
            let k = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return Err("json: missing ':'");
            }
            self.p += 1;
            kvs.push((k, self.value()?));
            self.ws();
            match self.peek() {
                Some(b',') => self.p += 1,
                Some(b'}') => {
                    self.p += 1;
                    return Ok(Value::Object(kvs));
                }
                _ => return Err("json: missing ',' or '}'"),
            }
        }
    }
    fn array(&mut self) -> Result<Value, &'static str> {
        self.p += 1;
        let mut vs = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.p += 1;
            return Ok(Value::Array(vs));
        }
        loop {
            vs.push(self.value()?);
            self.ws();
            match self.peek() {
                Some(b',') => self.p += 1,
                Some(b']') => {
                    self.p += 1;
                    return Ok(Value::Array(vs));
                }
                _ => return Err("json: missing ',' or ']'"),
            }
        }
    }
    fn number(&mut self) -> Result<Value, &'static str> {
        let start = self.p;
        if self.peek() == Some(b'-') {
            self.p += 1;
        }
        let digits = |p: &mut Self| {
            let s = p.p;
            while matches!(p.peek(), Some(b'0'..=b'9')) {
                p.p += 1;
            }
            p.p - s
        };
        let first = self.peek();
        let n = digits(self);
        if n == 0 || (first == Some(b'0') && n > 1) {
            return Err("json: invalid number");
        }
        if self.peek() == Some(b'.') {
            self.p += 1;
            if digits(self) == 0 {
                return Err("json: invalid number");
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.p += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.p += 1;
            }
            if digits(self) == 0 {
                return Err("json: invalid number");
            }
        }
        Ok(Value::Number(String::from_utf8_lossy(&self.b[start..self.p]).into_owned()))
    }
    fn hex4(&mut self) -> Result<u32, &'static str> {
        let h = self.b.get(self.p..self.p + 4).ok_or("json: short \\u escape")?;
        let s = std::str::from_utf8(h).map_err(|_| "json: bad \\u escape")?;
        let v = u32::from_str_radix(s, 16).map_err(|_| "json: bad \\u escape")?;
        self.p += 4;
        Ok(v)
    }
    fn string(&mut self) -> Result<String, &'static str> {
        self.p += 1;
        let mut out = Vec::new();
        loop {
            let c = self.peek().ok_or("json: unterminated string")?;
            self.p += 1;
            match c {
                b'"' => break,
                b'\\' => {
                    let e = self.peek().ok_or("json: unterminated string")?;
                    self.p += 1;
                    let ch = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let mut v = self.hex4()?;
                            if (0xd800..0xdc00).contains(&v) && self.b[self.p..].starts_with(b"\\u") {
                                let save = self.p;
                                self.p += 2;
                                let lo = self.hex4()?;
                                if (0xdc00..0xe000).contains(&lo) {
                                    v = 0x10000 + ((v - 0xd800) << 10) + (lo - 0xdc00);
                                } else {
                                    self.p = save;
                                }
                            }
                            char::from_u32(v).unwrap_or('\u{fffd}')
                        }
                        _ => return Err("json: bad escape"),
                    };
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                }
                0..=0x1f => return Err("json: control character in string"),
                _ => out.push(c),
            }
        }
        // Like Go, invalid UTF-8 becomes U+FFFD.
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}
