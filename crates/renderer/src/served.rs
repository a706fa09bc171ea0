//! The document as the site served it: its headers, type and body, read from the browser
//! after the page loads. Block pages are known by their markup as served (an entity, a
//! header), which the rendered DOM may write otherwise, so block detection reads this too.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use chromiumoxide::Page;
use chromiumoxide::cdp::browser_protocol::network::{
    EventResponseReceived, GetResponseBodyParams, ResourceType,
};
use chromiumoxide::listeners::EventStream;
use futures_util::{FutureExt, StreamExt};

/// The served document, bounded.
#[derive(Debug, Clone, Default)]
pub struct Served {
    /// Header names in lower case, with their values.
    pub headers: Vec<(String, String)>,
    pub content_type: Option<String>,
    /// The body's first `most` bytes (`read`'s bound).
    pub body: Vec<u8>,
}

impl Served {
    /// The value of header `name` (any case), if the document had it.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The main document's response among those the browser has told of (the first of type
/// `Document`: a page's frames come after it), with its body's first `most` bytes. `None`
/// when the browser has not told of it or no longer holds its body.
pub async fn read(
    page: &Page,
    responses: &mut EventStream<EventResponseReceived>,
    most: usize,
) -> Option<Served> {
    let document = loop {
        // Told before the load the caller waited for: what is not here now never comes.
        let event = responses.next().now_or_never()??;
        if event.r#type == ResourceType::Document {
            break event;
        }
    };
    let params = GetResponseBodyParams::new(document.request_id.clone());
    let body = page.execute(params).await.ok()?.result;
    let mut body = match body.base64_encoded {
        true => BASE64.decode(body.body.as_bytes()).ok()?,
        false => body.body.into_bytes(),
    };
    body.truncate(most);
    let headers = document.response.headers.inner().as_object().map(|all| {
        let text = |(name, value): (&String, &serde_json::Value)| {
            Some((name.to_ascii_lowercase(), value.as_str()?.to_owned()))
        };
        all.iter().filter_map(text).collect()
    });
    Some(Served {
        headers: headers.unwrap_or_default(),
        content_type: Some(document.response.mime_type.clone()),
        body,
    })
}
