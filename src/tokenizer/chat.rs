//! Chat templates (`tokenizer.chat_template`, Jinja as in HF transformers) via minijinja.

use anyhow::Context;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub fn render(template: &str, messages: &[ChatMessage], add_generation_prompt: bool, bos: &str, eos: &str) -> anyhow::Result<String> {
    let mut env = minijinja::Environment::new();
    // HF renders with trim_blocks and lstrip_blocks.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.add_function("strftime_now", |fmt: String| -> String {
        // Templates use this for "today's date" lines; a fixed date keeps prompts reproducible.
        fmt.replace("%d", "01").replace("%B", "January").replace("%b", "Jan").replace("%Y", "2026").replace("%m", "01")
    });
    env.add_template("chat", template).context("parsing the chat template")?;
    let tpl = env.get_template("chat").expect("just added");
    tpl.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos,
        eos_token => eos,
    })
    .context("rendering the chat template")
}
