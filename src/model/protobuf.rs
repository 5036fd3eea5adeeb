//! The little protobuf that reading and patching ONNX files needs, by hand, to keep a protobuf code
//! generator out of the build: iterate over one message's fields (fixed-width values skipped, never
//! read), and write varint and length-delimited fields.

/// One protobuf field's value (fixed-width values are skipped, not read).
pub(crate) enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The top-level fields of one protobuf message, as (field number, value).
pub(crate) fn fields(message: &[u8]) -> Fields<'_> {
    Fields(message)
}

/// See [`fields`].
pub(crate) struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Value<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = (|| {
            let key = read_varint(&mut self.0)?;
            let value = match key & 7 {
                0 => Value::Varint(read_varint(&mut self.0)?),
                1 => Value::Fixed.skip(&mut self.0, 8)?,
                5 => Value::Fixed.skip(&mut self.0, 4)?,
                2 => {
                    let len = usize::try_from(read_varint(&mut self.0)?).map_err(|_| "a field is too long")?;
                    if len > self.0.len() {
                        return Err("the file is cut short".to_string());
                    }
                    let (bytes, rest) = self.0.split_at(len);
                    self.0 = rest;
                    Value::Bytes(bytes)
                }
                w => return Err(format!("unexpected protobuf wire type {w}")),
            };
            Ok((key >> 3, value))
        })();
        if field.is_err() {
            self.0 = &[];
        }
        Some(field)
    }
}

impl Value<'_> {
    fn skip(self, buf: &mut &[u8], n: usize) -> Result<Self, String> {
        if buf.len() < n {
            return Err("the file is cut short".into());
        }
        *buf = &buf[n..];
        Ok(self)
    }
}

pub(crate) fn read_varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first().ok_or("the file is cut short")?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a varint is longer than 10 bytes".into())
}

/// Append `v` as a varint.
pub(crate) fn write_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A varint field.
pub(crate) fn int_field(number: u64, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    write_varint(number << 3, &mut out);
    write_varint(value, &mut out);
    out
}

/// A length-delimited field: bytes, a string or an embedded message.
pub(crate) fn bytes_field(number: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 8);
    write_varint(number << 3 | 2, &mut out);
    write_varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// A string field.
pub(crate) fn string_field(number: u64, s: &str) -> Vec<u8> {
    bytes_field(number, s.as_bytes())
}
